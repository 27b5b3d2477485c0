"""Statistical alignments of `mtx prepare`'s training split, kept beside it for guided
alignment training (`train.align_weight`).

`mtx align prepared --config C` reads the prepared pairs a chunk at a time, reads each side's words
from its pieces (pieces.py: the words the model sees), aligns the chunk with eflomal in both
directions and grow-diag-final-and (statistical.py), and writes each pair's links as piece
links (every piece of the source word with every piece of the target word) to
RUN/prepared/align/: `offsets.npy` (rows + 1 int64: where each row's links start),
`links.npy` (int32 (source position, target position) pairs, positions in the prepared
`src_ids` and `tgt_ids`) and `info.json` (the training split's pairs_sha256 and the
vocabulary's sha256, so that alignments of other data, or of the same text in other
pieces, are refused). Written to a temporary folder and renamed: whole or
absent. Training memory-maps the two arrays (`PieceLinks`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from array import array
from pathlib import Path

import numpy as np

from mtx.align import pieces as P
from mtx.align.statistical import CHUNK, align_chunk, default_samplers
from mtx.checkpoint import RunDir
from mtx.config import Config
from mtx.errors import MtxError
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

FOLDER = "align"


def folder(cfg: Config) -> Path:
    return RunDir.of(cfg).prepared / FOLDER


class PieceLinks:
    """The piece links of each prepared training pair, memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.offsets = np.load(path / "offsets.npy", mmap_mode="r")
        self.links = np.load(path / "links.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sha256(self) -> str:
        """Of the offsets and links, a chunk at a time (never all in memory)."""
        h = hashlib.sha256()
        for flat in (self.offsets, self.links.reshape(-1)):
            for start in range(0, len(flat), 1 << 22):
                h.update(np.ascontiguousarray(flat[start : start + (1 << 22)]).tobytes())
        return h.hexdigest()

    def __getitem__(self, row: int) -> np.ndarray:
        """(k, 2) int32: (source position, target position) of each link of pair `row`."""
        return np.asarray(self.links[self.offsets[row] : self.offsets[row + 1]])


def load(cfg: Config, rows: int) -> PieceLinks:
    """The alignments `mtx align` kept for this config's prepared training split, refused in
    one line if absent or made for other data."""
    from mtx.data.prepared import load_manifest

    path = folder(cfg)
    if not (path / "info.json").is_file():
        raise MtxError(
            f"train.align_weight needs alignments of the training data in {path}: run "
            "`mtx align prepared --config ...` after `mtx prepare`"
        )
    info = json.loads((path / "info.json").read_text())
    manifest = load_manifest(cfg)
    same = info.get("train_sha256") == manifest.splits["train"].pairs_sha256
    # the same text segmented by another vocabulary has other pieces to link
    if not same or info.get("vocabulary_sha256") != manifest.spm_sha256 or info["rows"] != rows:
        raise MtxError(
            f"{path} holds alignments of other prepared data (another text or vocabulary): run "
            "`mtx align prepared` again"
        )
    return PieceLinks(path)


def _pieces(vocab, ids: list[int], special: set[int]) -> list[str | None]:
    return [None if i in special else vocab.id_to_piece(i) for i in ids]


def specials(vocab, tags: dict[str, int]) -> set[int]:
    """Ids that are no text: control ids (PAD, BOS, EOS) and target-language tags. UNK is
    text (a word the vocabulary cannot spell is still a word)."""
    n = vocab.get_piece_size()
    out = {i for i in range(min(n, 8)) if vocab.is_control(i)} | set(tags.values())
    return (out | {PAD_ID, BOS_ID, EOS_ID}) - {UNK_ID}


def align_prepared(cfg: Config, chunk: int = CHUNK, samplers: int = 0, log=print) -> Path:
    """Align the prepared training split (see the module's docstring); the folder written."""
    from mtx.data import vocab as vocabulary
    from mtx.data.prepared import load_manifest, load_prepared, load_spm_proto

    manifest = load_manifest(cfg)
    ds = load_prepared(cfg, "train").select_columns(["src_ids", "tgt_ids"])
    vocab = vocabulary.load(load_spm_proto(cfg))
    special = specials(vocab, manifest.tags)
    samplers = samplers or default_samplers()
    out = folder(cfg)
    tmp = Path(tempfile.mkdtemp(prefix=".align.", dir=out.parent))
    try:
        offsets, total = array("q", [0]), 0
        with open(tmp / "links.bin", "wb") as flat:
            for start in range(0, len(ds), chunk):
                rows = ds[start : start + chunk]
                src = [_pieces(vocab, ids, special) for ids in rows["src_ids"]]
                tgt = [_pieces(vocab, ids, special) for ids in rows["tgt_ids"]]
                pairs = [(" ".join(P.words(s)), " ".join(P.words(t))) for s, t in zip(src, tgt)]
                for s, t, links in zip(src, tgt, align_chunk(pairs, samplers)):
                    piece_links = P.to_pieces(links, P.word_index(s), P.word_index(t))
                    flat.write(np.asarray(piece_links, dtype=np.int32).reshape(-1, 2).tobytes())
                    total += len(piece_links)
                    offsets.append(total)
                log(f"aligned {len(offsets) - 1:,} of {len(ds):,} training pairs")
        _to_npy(tmp / "links.bin", tmp / "links.npy", total)
        np.save(tmp / "offsets.npy", np.frombuffer(offsets, dtype=np.int64))
        info = {
            "aligner": "eflomal, grow-diag-final-and",
            "rows": len(ds),
            "links": total,
            "samplers": samplers,
            "train_sha256": manifest.splits["train"].pairs_sha256,
            "vocabulary_sha256": manifest.spm_sha256,
        }
        (tmp / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _to_npy(raw: Path, path: Path, total: int) -> None:
    """The raw (total, 2) int32 links as an .npy file, copied through memory maps (the links
    are never all in memory); `raw` deleted."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(total, 2))
    if total:
        out[:] = np.memmap(raw, dtype=np.int32, mode="r").reshape(total, 2)
    out.flush()
    del out
    raw.unlink()
