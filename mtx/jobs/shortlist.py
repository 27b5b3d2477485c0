"""Building a lexical shortlist (`mtx shortlist`) from a run's prepared training pairs; what
it is and how the searches decode with it: decode/shortlist.py.

For every source piece s, the `top` target pieces t of highest
c(s, t) * log(c(s, t) N / (c(s) c(t))) over the N pairs, where c counts the pairs holding s,
t or both: the pairs' share of the pointwise mutual information, which ranks the pieces that
come with s in particular above those that come with everything (p(t | s) ranks those
first); and the `frequent` target pieces found in the most pairs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from mtx.config import Config
from mtx.decode.shortlist import Shortlist, vocabulary_sha256
from mtx.errors import MtxError

CHUNK = 100_000  # pairs counted at a time: memory stays bounded on large corpora


def build(
    pairs: Iterable[tuple[list[int], list[int]]],
    vocab_size: int,
    top: int,
    frequent: int,
    vocabulary: str,
) -> Shortlist:
    """The shortlist of (source ids, target ids) pairs, as prepared (EOS included: the
    target's EOS makes it a frequent piece, and it is every sentence's candidate anyway)."""
    V = vocab_size
    c_src, c_tgt = np.zeros(V, np.int64), np.zeros(V, np.int64)
    keys: list[np.ndarray] = []
    merged = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    n = 0
    for src, tgt in pairs:
        s, t = np.unique(np.asarray(src, np.int64)), np.unique(np.asarray(tgt, np.int64))
        c_src[s] += 1
        c_tgt[t] += 1
        keys.append((s[:, None] * V + t[None, :]).ravel())
        n += 1
        if len(keys) == CHUNK:
            merged, keys = _merge(merged, keys), []
    key, count = _merge(merged, keys)
    if n == 0:
        raise MtxError("no training pairs to build a shortlist from")
    s, t = key // V, key % V
    weight = count * np.log(count * n / (c_src[s] * c_tgt[t]))
    order = np.lexsort((t, -weight, s))  # by source piece, the best first, ties by id
    s, t = s[order], t[order]
    first = np.searchsorted(s, np.arange(V))
    rank = np.arange(len(s)) - first[s]
    table = np.full((V, top), -1, np.int32)
    keep = rank < top
    table[s[keep], rank[keep]] = t[keep]
    most = np.argsort(-c_tgt, kind="stable")[:frequent]
    return Shortlist(table, most[c_tgt[most] > 0].astype(np.int32), vocabulary)


def from_prepared(cfg: Config, top: int, frequent: int, log) -> Shortlist:
    """The shortlist of a run's prepared training pairs (`mtx shortlist`); logs how many
    candidates a validation sentence gets and how many of its target pieces are among them."""
    from mtx.checkpoint import RunDir
    from mtx.data.prepared import load_prepared, load_spm_proto

    train = load_prepared(cfg, "train").select_columns(["src_ids", "tgt_ids"])
    spm_proto = load_spm_proto(cfg)
    vocabulary, size = vocabulary_sha256(spm_proto), _vocab_size(spm_proto)
    log(f"counting the pieces of {len(train)} training pairs ({size} pieces)")
    pairs = (
        (s, t) for batch in train.iter(batch_size=10_000)
        for s, t in zip(batch["src_ids"], batch["tgt_ids"])
    )  # fmt: skip
    shortlist = build(pairs, size, top, frequent, vocabulary)
    if RunDir.of(cfg).data.split("valid").is_dir():
        _report(shortlist, load_prepared(cfg, "valid"), size, log)
    return shortlist


def _report(shortlist: Shortlist, valid, size: int, log) -> None:
    sizes, covered, total = [], 0, 0
    for src, tgt in zip(valid["src_ids"], valid["tgt_ids"]):
        ids = shortlist.candidates(torch.tensor(src)).numpy()
        sizes.append(len(ids))
        covered += int(np.isin(tgt, ids).sum())
        total += len(tgt)
    log(
        f"validation: {np.mean(sizes):.0f} candidates a sentence on average (of {size}); "
        f"{covered / max(total, 1):.2%} of its target pieces are among them"
    )


def _vocab_size(spm_proto: bytes) -> int:
    from mtx.data import vocab

    return vocab.load(spm_proto).get_piece_size()


def _merge(merged: tuple[np.ndarray, np.ndarray], keys: list[np.ndarray]) -> tuple:
    """(sorted unique keys, counts) of `merged` and the new keys."""
    if not keys:
        return merged
    new, counts = np.unique(np.concatenate(keys), return_counts=True)
    key = np.concatenate([merged[0], new])
    unique, inverse = np.unique(key, return_inverse=True)
    total = np.bincount(inverse, np.concatenate([merged[1], counts]), len(unique))
    return unique, total.astype(np.int64)
