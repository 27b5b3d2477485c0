"""`mtx prepare`: raw parallel text -> cleaned -> SentencePiece BPE -> encoded Arrow data.
Training, validation and `mtx evaluate --split` read it back with data/prepared.py.

Layout of RUN/prepared/ (written to a temporary folder and renamed when complete, so an
interrupted prepare never leaves data that `train` would accept):

    spm.model          the vocabulary (data/vocab.py): the joint SentencePiece model trained
                       here, or the one data.spm_model names (a SentencePiece model file, or a
                       checkpoint, which embeds its vocabulary: an imported model's segments
                       source and target with their own models, mtx/formats/)
    spm.vocab          its pieces, one per line with their id and score (for people to read)
    dropped.tsv        every pair the cleaning dropped, with its reason (data/filtering.py)
    manifest.json      the data's description: sources, sha256 of local source files, counts of
                       read, kept and dropped pairs, sha256 of the kept pairs and of spm.model,
                       vocabulary size, where spm.model came from, mtx version (checkpoints
                       carry a copy)
    train/ valid/ test/  `datasets` folders (save_to_disk), memory-mapped by training, columns:
                       src, tgt (text), src_ids, tgt_ids (int32, each ending in EOS), src_len, tgt_len

The cleaning rules (data/clean.py, applied by data/filtering.py) and the encoding run in
`data.workers` processes (datasets.map's num_proc), the encoders each loading spm.model from
its file and segmenting each distinct word once (data/words.py); duplicates, the lexical
rule, the dual cross-entropy filter and the length rules then drop pairs in this process, in
order, so the prepared data, its manifest and dropped.tsv are the same for any
number of workers (tests/test_data.py, tests/test_filtering.py).
"""

from __future__ import annotations

import hashlib
import shutil
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mtx import __version__, corpora
from mtx.checkpoint import Manifest, PreparedFiles, RunDir, SetRecord, SplitRecord, SpmSource
from mtx.config import Config, DataConfig
from mtx.data import filtering, sources, vocab
from mtx.data.clean import PairCleaner
from mtx.data.filtering import Dropped, DualScorer
from mtx.data.words import Words
from mtx.device import cores
from mtx.errors import MtxError
from mtx.files import sha256_file
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ENCODE_BATCH = 10_000  # sentences a batch: Arrow's and numpy's work per batch is per word
SPLITS = {"train": "train", "valid": "validation", "test": "test"}  # ours -> hub default split
ENCODED = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.Sequence(datasets.Value("int32")),
        "tgt_ids": datasets.Sequence(datasets.Value("int32")),
        "src_len": datasets.Value("int32"),
        "tgt_len": datasets.Value("int32"),
        "group": datasets.Value("int32"),
        "line": datasets.Value("int64"),  # in its source: for dropped.tsv, not written
    }
)


def _training_sentences(ds: datasets.Dataset, sample: int) -> Iterator[str]:
    """Both sides of every pair in order or, where they hold more than `sample` sentences (0:
    no limit), both sides of sample / 2 pairs drawn at random (seeded), in order: SentencePiece
    then reads only the sentences it trains on (it samples no further), not millions more to
    sample from."""
    ds = ds.select_columns(["src", "tgt"])
    if not sample or 2 * len(ds) <= sample:
        batches = ds.iter(batch_size=10_000)
    else:
        rows = np.sort(np.random.default_rng(0).choice(len(ds), max(1, sample // 2), replace=False))
        batches = (ds[rows[i : i + 10_000]] for i in range(0, len(rows), 10_000))
    for batch in batches:
        yield from batch["src"]
        yield from batch["tgt"]


class Encoder:
    """Batched `datasets.map` function over Arrow batches: text -> ids (+EOS) and lengths,
    each distinct word encoded once by SentencePiece in `threads` threads (data/words.py).
    It pickles as the model file's path: each worker process loads the SentencePiece model
    once, itself."""

    def __init__(
        self, spm_path: Path, threads: int = 1, group: int = 0, tag: int = 0, tgt_tag: int = 0
    ) -> None:
        """`tag`: the id each source starts with (a target-language tag, or an NLLB model's
        source-language code; 0: none); `tgt_tag` the id each target starts with (an NLLB
        model's target-language code, which its decoder reads after its start)."""
        self.path, self.threads, self.words = str(spm_path), threads, None
        self.group, self.tag, self.tgt_tag = group, tag, tgt_tag

    def __getstate__(self) -> dict:
        return self.__dict__ | {"words": None}

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.words is None:  # (source, target): one Words where one model segments both
            v = vocab.load(Path(self.path).read_bytes())
            source = Words(v.source, self.threads)
            self.words = (source, source if v.target is v.source else Words(v.target, self.threads))
        n = len(batch)
        src_ids = self._ids(self.words[0], batch["src"], self.tag)
        tgt_ids = self._ids(self.words[1], batch["tgt"], self.tgt_tag)
        lines = batch["line"] if "line" in batch.column_names else pa.array([0] * n, pa.int64())
        return pa.table(
            {
                "src": batch["src"],
                "tgt": batch["tgt"],
                "src_ids": src_ids,
                "tgt_ids": tgt_ids,
                "src_len": pc.list_value_length(src_ids).cast(pa.int32()),
                "tgt_len": pc.list_value_length(tgt_ids).cast(pa.int32()),
                "group": pa.array(np.full(n, self.group, np.int32)),
                "line": lines,  # in its source (0: not from a file)
            }
        )

    def _ids(self, words: Words, texts: pa.ChunkedArray, tag: int) -> pa.ListArray:
        """Each text's ids after `tag` (0: none) and before EOS, as an Arrow list<int32>."""
        ids, offsets = words.encode(texts.combine_chunks())
        before = 1 if tag else 0
        sizes = np.diff(offsets)
        out_offsets = (offsets + (before + 1) * np.arange(len(offsets))).astype(np.int32)
        out = np.empty(out_offsets[-1], np.int32)
        out[out_offsets[1:] - 1] = EOS_ID
        if tag:
            out[out_offsets[:-1]] = tag
        body = np.repeat(out_offsets[:-1] + before, sizes) + (
            np.arange(len(ids)) - np.repeat(offsets[:-1], sizes)
        )
        out[body] = ids
        return pa.ListArray.from_arrays(pa.array(out_offsets), pa.array(out))


def worker_count(setting: int, pairs: int) -> int:
    """data.workers: the number asked for, or with 0 one per CPU core this process may use,
    but no more than one per 20,000 pairs (a process costs more than it saves below that)."""
    if setting > 0:
        return setting
    return max(1, min(cores(), pairs // 20_000))


def read_spm_model(path: str) -> tuple[bytes, SpmSource]:
    """data.spm_model: (the SentencePiece model proto, where it came from for the manifest).
    PATH is a SentencePiece model file or an mtx checkpoint, which embeds its model."""
    p = Path(path)
    if not p.is_file():
        raise MtxError(f"data.spm_model: no such file: {p}")
    kind = "sentencepiece"
    proto = p.read_bytes()
    if zipfile.is_zipfile(p):  # torch.save's format: a checkpoint
        from mtx.checkpoint import Checkpoint

        try:
            proto, kind = Checkpoint.load(p).spm_model, "checkpoint"
        except MtxError as e:
            raise MtxError(f"data.spm_model: {e}") from None
    try:
        v = vocab.load(proto)
    except Exception:  # sentencepiece raises RuntimeError or OSError, with C++ detail
        raise MtxError(
            f"data.spm_model {p}: not a SentencePiece model file or an mtx checkpoint"
        ) from None
    if not isinstance(v, vocab.Joint):  # an imported model's: its ids were mapped on import
        return proto, SpmSource(kind, str(p.resolve()), sha256_file(p))
    sp = v.sp
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise MtxError(
            f"data.spm_model {p}: its pad, unk, bos and eos ids are {ids}; mtx needs "
            f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)} (train it with pad_id=0 unk_id=1 bos_id=2 eos_id=3)"
        )
    return proto, SpmSource(kind, str(p.resolve()), sha256_file(p))


def prepare(cfg: Config, log=print, dual: DualScorer | None = None) -> Path:
    """Prepare the run's data; returns RUN/prepared. `dual` scores pairs for the dual
    cross-entropy filter (jobs/dual.py), which data.clean.dual_forward asks for."""
    if cfg.data.clean.dual_forward and dual is None:
        raise MtxError("data.clean.dual_forward is set but no scorer was given to prepare")
    returning_memory_pool()
    final = RunDir.of(cfg).prepared
    tmp = final.with_name("prepared.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    made = [p for p in reversed(tmp.parents) if not p.exists()]  # removed again if it fails
    tmp.mkdir(parents=True)
    try:
        dropped = Dropped(PreparedFiles(tmp).dropped)
        try:
            manifest = _prepare_into(cfg, PreparedFiles(tmp), dropped, dual, log)
        finally:
            dropped.close()
        manifest.write(PreparedFiles(tmp).manifest)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            for folder in reversed(made):  # a failed prepare leaves no empty run folder
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
    log(
        f"prepared data in {final} (vocabulary {manifest.vocab_size}, "
        f"{manifest.splits['train'].kept} training pairs)"
    )
    return final


def returning_memory_pool() -> None:
    """Arrow's buffers from jemalloc, which gives freed memory back within a second (the
    system allocator where jemalloc is not built in): pyarrow's default, mimalloc, kept about
    0.5 GiB of the lexical rule's freed blocks. The encoding and cleaning processes, forked,
    inherit it."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:
        pa.set_memory_pool(pa.system_memory_pool())


def _prepare_into(cfg: Config, out: PreparedFiles, dropped: Dropped, dual, log) -> Manifest:
    d = cfg.data
    given = read_spm_model(d.spm_model) if d.spm_model else None  # refused before any work
    codes = vocab.load(given[0]).languages if given else {}  # an NLLB model's
    for c in corpora.corpora(d) if codes else []:
        languages(c, codes)
    seconds: Counter[str] = Counter()  # per stage, logged at the end
    groups = split_groups(d)
    texts = {
        split: [
            _read_and_clean(d, g, split, out, dropped, dual, seconds, log) for g in groups[split]
        ]
        for split in groups
    }

    start = time.perf_counter()
    model_proto, spm_source = given or _train_spm(d, texts["train"], log)
    if given:
        log(f"encoding with {spm_source.path} (data.spm_model); data.vocab_size is not used")
    out.spm_model.write_bytes(model_proto)
    sp = vocab.load(model_proto)
    score = sp.sp.get_score if isinstance(sp, vocab.Joint) else lambda i: 0.0
    out.spm_vocab.write_text(
        "".join(f"{i}\t{sp.id_to_piece(i)}\t{score(i):g}\n" for i in range(sp.get_piece_size())),
        encoding="utf-8",
    )
    # a model with tags (trained here for several target languages, or a multilingual
    # model's, to fine-tune it) tags every source, as its translator will
    tag_of = corpora.tag_ids(sp)
    targets = {c.tgt_lang for c in corpora.corpora(d)}
    missing = sorted(targets - set(tag_of))
    if (tag_of or len(targets) > 1) and missing:
        raise MtxError(
            f"data.spm_model {d.spm_model}: no tag >>xx<< for target language(s) "
            f"{', '.join(missing)}; the model's tags are for {', '.join(sorted(tag_of)) or 'none'}"
        )
    seconds["sentencepiece"] += time.perf_counter() - start

    manifest = Manifest(
        mtx_version=__version__,
        src_lang=d.src_lang if not d.corpora else None,
        tgt_lang=d.tgt_lang if not d.corpora else None,
        vocab_size=sp.get_piece_size(),
        spm_sha256=hashlib.sha256(model_proto).hexdigest(),
        spm_source=spm_source,
        tags=tag_of,
        splits={},
    )
    for split in groups:  # popped: each split's memory map is let go once it is written
        parts = texts.pop(split)
        if not parts:
            continue  # no test set
        entry = _encode_and_write(
            d, split, groups[split], parts, tag_of, sp.languages, out, dropped, seconds, log
        )
        manifest.splits[split] = entry
    shutil.rmtree(out.cache, ignore_errors=True)
    filtering.report(manifest.splits, log)
    log("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    return manifest


def split_groups(d: DataConfig) -> dict[str, list[corpora.EvalSet]]:
    """Each split's parts, in order: the training data of every corpus (named by corpus),
    every validation set, every test set (prepared/SPLIT holds them one after the other, the
    `group` column numbering them)."""
    cs = corpora.corpora(d)
    return {
        "train": [corpora.EvalSet(c.name, c.train, c.src_lang, c.tgt_lang, c.key) for c in cs],
        "valid": [v for c in cs for v in c.valid],
        "test": [c.test for c in cs if c.test is not None],
    }


def _read_and_clean(
    d: DataConfig, g: corpora.EvalSet, split: str, out: PreparedFiles, dropped: Dropped, dual,
    seconds: Counter, log,
) -> tuple:  # fmt: skip
    """(the part's cleaned pairs, counts of the pairs read and dropped by reason). Training
    pairs meet every rule of data.clean, validation pairs the empty rule, test pairs none."""
    label = _label(split, g)
    log(f"{label}: loading {sources.describe(g.spec, g.src_lang, g.tgt_lang)}")
    start = time.perf_counter()
    raw = sources.load_split(g.spec, g.src_lang, g.tgt_lang, SPLITS[split], out.cache)
    seconds["read"] += time.perf_counter() - start
    train = split == "train"
    rules = filtering.rules(d, g.src_lang, g.tgt_lang, log) if train else None
    cleaner = PairCleaner(split != "test", rules, d.dedup if train else "false")
    where = f"{split}\t{g.name}"
    workers = worker_count(d.workers, len(raw))
    if train:
        log(f"{label}: cleaning {len(raw):,} pairs ({workers} worker{'s' if workers > 1 else ''})")
    text, counts = filtering.clean_part(raw, cleaner, workers, out.cache, where, dropped, seconds)
    if train and len(text):
        langs = (g.src_lang, g.tgt_lang)
        text, after = filtering.corpus_rules(
            text, d, langs, dual, where, dropped, out.cache, seconds, log
        )
        counts.update(after)
    if split != "test" and len(text) == 0:
        raise MtxError(f"{_key(split, g)} ({g.spec}) has no usable pairs after cleaning")
    return text, counts


def _label(split: str, g: corpora.EvalSet) -> str:
    """How the log names a part: train, valid en-de, train NAME."""
    return split if g.single and split != "valid" else f"{split} {g.name}"


def _key(split: str, g: corpora.EvalSet) -> str:
    """How an error names the config key of a part: data.train, data.corpora[1].valid."""
    return f"{g.key}{split}"


def _train_spm(d: DataConfig, train: list, log) -> tuple[bytes, SpmSource]:
    """(a joint SentencePiece BPE model trained on the training pairs, where it came from).
    With several corpora, on a sample of data.spm_sample pairs (0: as many as there are)
    balanced by data.corpus_temperature, and one reserved piece per target language."""
    tags = corpora.tags(d)
    log(f"training SentencePiece BPE (vocab_size {d.vocab_size})")
    if len(train) == 1:
        sentences, sample = _training_sentences(train[0][0], d.spm_sample), d.spm_sample
    else:
        sentences, sample = _balanced_sentences(d, [text for text, _ in train]), 0
    proto = vocab.train_bpe(sentences, d.vocab_size, sample, d.character_coverage, tags)
    return proto, SpmSource("trained")


def _balanced_sentences(d: DataConfig, texts: list[datasets.Dataset]) -> Iterator[str]:
    """Both sides of round(p_i x M) pairs of corpus i (M: every corpus's pairs together, at
    most data.spm_sample), with p_i as batches are sampled (corpora.shares)."""
    sizes = [len(t) for t in texts]
    total = min(d.spm_sample or sum(sizes), sum(sizes))
    weights = [c.weight for c in corpora.corpora(d)]
    for i, (text, share) in enumerate(
        zip(texts, corpora.shares(sizes, weights, d.corpus_temperature))
    ):
        want = int(round(share * total))
        rng = np.random.default_rng([0, i])
        rows = np.concatenate([rng.permutation(len(text)) for _ in range(-(-want // len(text)))])
        for start in range(0, want, 10_000):
            batch = text[rows[start : min(start + 10_000, want)]]
            yield from batch["src"]
            yield from batch["tgt"]


def _encode_and_write(
    d: DataConfig,
    split: str,
    groups: list[corpora.EvalSet],
    parts: list[tuple],
    tag_of: dict[str, int],
    languages_of: dict[str, int],
    out: PreparedFiles,
    dropped: Dropped,
    seconds,
    log,
) -> SplitRecord:
    """Encode a split's parts, drop what is too long, write them to out/split one after the
    other; returns the split's entry of the manifest. `tag_of`: the >>xx<< tags' ids;
    `languages_of`: an NLLB model's language codes' ids."""
    encoded_parts, sets = [], []
    for k, (g, (text, counts)) in enumerate(zip(groups, parts)):
        tags = languages(g, languages_of) if languages_of else (tag_of.get(g.tgt_lang, 0), 0)
        encoded, entry = _encode_part(
            d, split, k, g, text, counts, tags, out, dropped, seconds, log
        )
        encoded_parts.append(encoded)
        sets.append(entry)
    start = time.perf_counter()
    whole = (
        encoded_parts[0]
        if len(encoded_parts) == 1
        else datasets.concatenate_datasets(encoded_parts)
    )
    whole.remove_columns("line").save_to_disk(str(out.split(split)))
    total: Counter[str] = Counter()
    for s in sets:
        total.update(s.dropped)
    entry = SplitRecord(
        source="; ".join(s.source for s in sets),
        files={k: v for s in sets for k, v in s.files.items()},
        read=sum(s.read for s in sets),
        kept=len(whole),
        dropped=dict(total),
        pairs_sha256=pairs_sha256(whole),
        sets=sets,
    )
    seconds["write"] += time.perf_counter() - start
    return entry


def languages(g: corpora.EvalSet | corpora.Corpus, codes: dict[str, int]) -> tuple[int, int]:
    """The ids an NLLB model's source and target start with: their languages' codes."""
    for side, lang in (("src_lang", g.src_lang), ("tgt_lang", g.tgt_lang)):
        if lang not in codes:
            raise MtxError(
                f"{g.key}{side}: {lang!r} is not a language code of data.spm_model's NLLB "
                f"vocabulary (e.g. {', '.join(sorted(codes)[:3])})"
            )
    return codes[g.src_lang], codes[g.tgt_lang]


def _encode_part(d, split, k, g, text, counts, tags, out, dropped, seconds, log) -> tuple:
    """Part k of a split encoded in data.workers processes (its sources and targets starting
    with `tags`' ids where not 0), its pairs too long dropped; returns it and its entry of the
    manifest."""
    start = time.perf_counter()
    workers = worker_count(d.workers, len(text))
    if split == "train":
        log(f"{_label(split, g)}: encoding {len(text):,} pairs")
    # SentencePiece encodes a batch in threads: the cores are shared among the workers
    encoded = (
        text.with_format("arrow")
        .map(
            Encoder(out.spm_model, max(1, cores() // workers), k, *tags),
            batched=True,
            batch_size=ENCODE_BATCH,
            features=ENCODED,
            num_proc=workers if workers > 1 else None,
            new_fingerprint=f"encode-{split}-{k}",
            cache_file_name=str(out.cache / f"encode-{split}-{k}.arrow"),
            desc=f"encoding {split}" + ("" if g.single else f" {g.name}"),
        )
        .with_format(None)
    )
    by_reason = dict(counts)
    if split != "test":  # test pairs are never dropped: BLEU is computed on the whole set
        encoded, too_long = filtering.keep_by_length(
            encoded, d.max_len, d.max_ratio, f"{split}\t{g.name}", dropped, out.cache
        )
        by_reason |= too_long
    seconds["encode"] += time.perf_counter() - start
    if split == "train" and len(encoded) == 0:
        raise MtxError(f"{_key(split, g)} ({g.spec}) is empty after cleaning (max_len {d.max_len})")
    read = by_reason.pop("read", 0)
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(by_reason.items()))
    log(
        f"{_label(split, g)}: kept {len(encoded)} of {read} pairs"
        + (f" (dropped: {reasons})" if by_reason else "")
    )
    entry = SetRecord(
        name=g.name,
        src_lang=g.src_lang,
        tgt_lang=g.tgt_lang,
        source=g.spec,
        files=sources.file_hashes(g.spec, g.src_lang, g.tgt_lang),
        read=read,
        kept=len(encoded),
        dropped=by_reason,
    )
    return encoded, entry


def pairs_sha256(ds: datasets.Dataset, batch_size: int = 100_000) -> str:
    """sha256 of the pairs as "src\ttgt\n" lines in order: what was trained on, whatever the
    source. Arrow joins a batch's lines into one buffer, which is hashed as it lies."""
    digest = hashlib.sha256()
    pairs = ds.select_columns(["src", "tgt"]).with_format("arrow")
    for batch in pairs.iter(batch_size=batch_size):
        tab = pc.binary_join_element_wise(batch["src"], batch["tgt"], "\t")
        lines = pc.binary_join_element_wise(tab, "", "\n").combine_chunks()  # "line\n" + ""
        width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
        offsets = np.frombuffer(lines.buffers()[1], width)[lines.offset :][: len(lines) + 1]
        digest.update(memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]])
    return digest.hexdigest()
