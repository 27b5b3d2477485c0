"""`mtx prepare`: raw parallel text -> cleaned -> SentencePiece BPE -> encoded Arrow data.

Layout of RUN/prepared/ (written to a temporary folder and renamed when complete, so an
interrupted prepare never leaves data that `train` would accept):

    spm.model          the joint SentencePiece model
    spm.vocab          its pieces, one per line with their id and score (for people to read)
    manifest.json      the data's description: sources, sha256 of local source files, counts of
                       read, kept and dropped pairs, sha256 of the kept pairs and of spm.model,
                       vocabulary size, mtx version (checkpoints carry a copy)
    train/ valid/ test/  `datasets` folders (save_to_disk), memory-mapped by training, columns:
                       src, tgt (text), src_ids, tgt_ids (int32, each ending in EOS), src_len, tgt_len
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import datasets

from mtx import __version__
from mtx.config import Config
from mtx.data import sources, vocab
from mtx.data.clean import TextCleaner, length_reason
from mtx.errors import MtxError
from mtx.tokens import EOS_ID

SPLITS = {"train": "train", "valid": "validation", "test": "test"}  # ours -> hub default split
ENCODED = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.Sequence(datasets.Value("int32")),
        "tgt_ids": datasets.Sequence(datasets.Value("int32")),
        "src_len": datasets.Value("int32"),
        "tgt_len": datasets.Value("int32"),
    }
)


def prepared_dir(cfg: Config) -> Path:
    return Path(cfg.run_dir) / "prepared"


def _training_sentences(ds: datasets.Dataset) -> Iterator[str]:
    for batch in ds.iter(batch_size=10_000):
        yield from batch["src"]
        yield from batch["tgt"]


class Encoder:
    """Batched `datasets.map` function: text -> ids (+EOS), dropping over-long pairs if asked."""

    def __init__(self, sp, max_len: int | None, max_ratio: float) -> None:
        self.sp, self.max_len, self.max_ratio = sp, max_len, max_ratio
        self.counts: Counter[str] = Counter()

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {k: [] for k in ENCODED}
        src_ids = self.sp.encode(batch["src"])
        tgt_ids = self.sp.encode(batch["tgt"])
        for src, tgt, s, t in zip(batch["src"], batch["tgt"], src_ids, tgt_ids):
            if self.max_len is not None:
                reason = length_reason(len(s), len(t), self.max_len, self.max_ratio)
                if reason:
                    self.counts[reason] += 1
                    continue
            out["src"].append(src)
            out["tgt"].append(tgt)
            out["src_ids"].append(s + [EOS_ID])
            out["tgt_ids"].append(t + [EOS_ID])
            out["src_len"].append(len(s) + 1)
            out["tgt_len"].append(len(t) + 1)
        return out


def prepare(cfg: Config, log=print) -> Path:
    """Prepare the run's data; returns RUN/prepared."""
    final = prepared_dir(cfg)
    tmp = final.with_name("prepared.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        manifest = _prepare_into(cfg, tmp, log)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(
        f"prepared data in {final} (vocabulary {manifest['vocab_size']}, "
        f"{manifest['splits']['train']['kept']} training pairs)"
    )
    return final


def _prepare_into(cfg: Config, out: Path, log) -> dict:
    d = cfg.data
    cache = out / "cache"
    texts, counts = {}, {}
    for split, hub_split in SPLITS.items():
        spec = getattr(d, split)
        log(f"{split}: loading {sources.describe(spec, d.src_lang, d.tgt_lang)}")
        raw = sources.load_split(spec, d.src_lang, d.tgt_lang, hub_split, cache)
        cleaner = TextCleaner(drop_empty=split != "test", dedup=d.dedup and split == "train")
        texts[split] = raw.map(
            cleaner,
            batched=True,
            new_fingerprint=f"clean-{split}",
            cache_file_name=str(cache / f"clean-{split}.arrow"),
        )
        counts[split] = cleaner.counts
        if split != "test" and len(texts[split]) == 0:
            raise MtxError(f"data.{split} ({spec}) has no usable pairs after cleaning")

    log(f"training SentencePiece BPE (vocab_size {d.vocab_size})")
    model_proto = vocab.train_bpe(
        _training_sentences(texts["train"]), d.vocab_size, d.spm_sample, d.character_coverage
    )
    (out / "spm.model").write_bytes(model_proto)
    sp = vocab.load(model_proto)
    (out / "spm.vocab").write_text(
        "".join(
            f"{i}\t{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())
        ),
        encoding="utf-8",
    )

    manifest = {
        "mtx_version": __version__,
        "src_lang": d.src_lang,
        "tgt_lang": d.tgt_lang,
        "vocab_size": sp.get_piece_size(),
        "spm_sha256": hashlib.sha256(model_proto).hexdigest(),
        "splits": {},
    }
    for split, text in texts.items():
        # Test pairs are never dropped: BLEU is computed on the whole test set.
        encoder = Encoder(sp, None if split == "test" else d.max_len, d.max_ratio)
        encoded = text.map(
            encoder,
            batched=True,
            features=ENCODED,
            remove_columns=text.column_names,
            new_fingerprint=f"encode-{split}",
            cache_file_name=str(cache / f"encode-{split}.arrow"),
        )
        if split == "train" and len(encoded) == 0:
            raise MtxError(f"data.train ({d.train}) is empty after cleaning (max_len {d.max_len})")
        encoded.save_to_disk(str(out / split))
        dropped = dict(counts[split]) | dict(encoder.counts)
        read = dropped.pop("read", 0)
        manifest["splits"][split] = {
            "source": getattr(d, split),
            "files": sources.file_hashes(getattr(d, split), d.src_lang, d.tgt_lang),
            "read": read,
            "kept": len(encoded),
            "dropped": dropped,
            "pairs_sha256": pairs_sha256(encoded),
        }
        log(
            f"{split}: kept {len(encoded)} of {read} pairs"
            + (
                f" (dropped: {', '.join(f'{k} {v}' for k, v in sorted(dropped.items()))})"
                if dropped
                else ""
            )
        )
    del encoded, text, texts
    shutil.rmtree(cache, ignore_errors=True)
    return manifest


def pairs_sha256(ds: datasets.Dataset) -> str:
    """sha256 of the pairs as "src\ttgt\n" lines in order: what was trained on, whatever the source."""
    digest = hashlib.sha256()
    for batch in ds.select_columns(["src", "tgt"]).iter(batch_size=10_000):
        for src, tgt in zip(batch["src"], batch["tgt"]):
            digest.update(f"{src}\t{tgt}\n".encode())
    return digest.hexdigest()


def load_manifest(cfg: Config) -> dict:
    path = prepared_dir(cfg) / "manifest.json"
    if not path.is_file():
        raise MtxError(
            f"no prepared data in {prepared_dir(cfg)}: run `mtx prepare` with this config first"
        )
    return json.loads(path.read_text())


def load_prepared(cfg: Config, split: str) -> datasets.Dataset:
    path = prepared_dir(cfg) / split
    if not (prepared_dir(cfg) / "manifest.json").is_file() or not path.is_dir():
        raise MtxError(
            f"no prepared data in {prepared_dir(cfg)}: run `mtx prepare` with this config first"
        )
    return datasets.load_from_disk(str(path))


def load_spm_proto(cfg: Config) -> bytes:
    path = prepared_dir(cfg) / "spm.model"
    if not path.is_file():
        raise MtxError(
            f"no SentencePiece model at {path}: run `mtx prepare` with this config first"
        )
    return path.read_bytes()
