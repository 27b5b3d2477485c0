"""The lexical rule (data.clean.lexical): pairs whose two sides do not translate each other's
words, as a misaligned pair's do not. No per-pair rule can see such a pair (each side is good
text in its language); this one learns which words translate which from the corpus itself.

The table: of the pairs the other rules kept (a seeded sample of SAMPLE when there are more),
word s and word t are translations when they occur in the same pairs often for how often each
occurs, a Dice coefficient 2 c(s, t) / (c(s) + c(t)) of at least DICE over at least
MIN_COUNT pairs; each word keeps its TOP best (ties: the earlier-met word). Words are the
lowercased runs of letters, marks and digits, each counted once a sentence.

A pair's coverage one way is the share of its source words that the table translates whose
translation is in the target, each word weighted by its rarity, log(pairs / c(s)) (so "a" and
"the" count for little, a word in every pair for nothing); words the table does not know are
left out. The pair's score is the mean of its two coverages (one of them, when the other
side has no word of any weight that the table knows; 1, keeping the pair, when neither has),
and a pair scoring under data.clean.lexical is dropped. On noisy Multi30k the mean found more
of the misaligned pairs than the lower of the two coverages or one coverage of both sides'
words pooled (BENCHMARKS.md, "Cleaning noisy corpora"). A part of fewer than MIN_PAIRS pairs
is not filtered (too few to learn a table from). Languages written without spaces offer whole phrases as words, which
the table rarely knows: such pairs are kept.

All of it is numpy over Arrow arrays, a block of BLOCK pairs at a time, in one process: the
same pairs are dropped for any number of workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SAMPLE = 100_000  # pairs the table is learnt from, at most
MIN_PAIRS = 10_000  # a part with fewer is not filtered
DICE = 0.1  # the least Dice coefficient of a translation
MIN_COUNT = 2  # the fewest pairs a translation is seen in
TOP = 3  # translations a word keeps
BLOCK = 100_000  # pairs scored at a time
COUNT_BLOCK = 5_000  # pairs whose co-occurring words are counted at a time
SEED = 0  # of the sample
_NOT_WORD = r"[^\p{L}\p{M}\p{N}]+"


@dataclass(frozen=True)
class Words:
    """A block's distinct words per sentence that a vocabulary holds: text `rows[i]` holds
    word `ids[i]` (an index into the vocabulary), sorted by row, then id."""

    rows: np.ndarray
    ids: np.ndarray


def _split(texts: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(each word's row, the words) of lowercased `texts`, empty strings left out."""
    lists = pc.split_pattern_regex(pc.utf8_lower(texts), _NOT_WORD)
    flat = pc.list_flatten(lists)
    rows = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    present = pc.greater(pc.utf8_length(flat), 0)
    return rows[present.to_numpy(zero_copy_only=False)], flat.filter(present)


def words(texts: pa.Array, vocab: pa.Array) -> Words:
    """The distinct words of each text that `vocab` holds, as ids into it."""
    rows, flat = _split(texts)
    found = pc.fill_null(pc.index_in(flat, value_set=vocab), -1)
    ids = found.to_numpy(zero_copy_only=False).astype(np.int64)
    known = ids >= 0
    size = max(len(vocab), 1)
    keys = _distinct(rows[known].astype(np.int64) * size + ids[known])
    return Words(keys // size, keys % size)


def _distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct values of `keys`, sorted: np.unique's result, by a sort (np.unique
    without return_counts hashes: 6.3 s against 0.1 s for 2.8M int64s, numpy 2.4, a one-off
    beside a training run)."""
    keys = np.sort(keys)
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) else keys


def vocabulary(texts: pa.Array) -> pa.Array:
    """The distinct words of `texts`, in the order they are first met."""
    return pc.unique(_split(texts)[1])


def _ranked(first: np.ndarray, second: np.ndarray, dice: np.ndarray, size: int) -> tuple:
    """(CSR starts over `size` words, translations) of each `first` word's TOP best
    `second` words by Dice coefficient (ties: the smaller id)."""
    order = np.lexsort((second, -dice, first))
    first, second = first[order], second[order]
    starts = np.searchsorted(first, np.arange(size + 1))
    rank = np.arange(len(first)) - starts[first]
    keep = rank < TOP
    first, second = first[keep], second[keep]
    return np.searchsorted(first, np.arange(size + 1)), second


@dataclass(frozen=True)
class Table:
    """Translations learnt from a sample of pairs, both ways."""

    src_vocab: pa.Array
    tgt_vocab: pa.Array
    src_weight: np.ndarray  # log(pairs / c(s)) of each source word
    tgt_weight: np.ndarray
    forward: tuple[np.ndarray, np.ndarray]  # source word -> CSR of target words
    backward: tuple[np.ndarray, np.ndarray]
    entries: int  # translations the table holds (before TOP)

    @classmethod
    def learn(cls, src: pa.Array, tgt: pa.Array) -> Table:
        src_vocab, tgt_vocab = vocabulary(src), vocabulary(tgt)
        s, t = words(src, src_vocab), words(tgt, tgt_vocab)
        vs, vt = len(src_vocab), len(tgt_vocab)
        cs = np.bincount(s.ids, minlength=vs)
        ct = np.bincount(t.ids, minlength=vt)
        both, counts = cooccurrences(s, t, len(src), vt)
        first, second = both // vt, both % vt
        dice = 2 * counts / (cs[first] + ct[second])
        keep = (counts >= MIN_COUNT) & (dice >= DICE)
        first, second, dice = first[keep], second[keep], dice[keep]
        pairs = len(src)
        return cls(src_vocab, tgt_vocab,
                   np.log(pairs / np.maximum(cs, 1)), np.log(pairs / np.maximum(ct, 1)),
                   _ranked(first, second, dice, vs), _ranked(second, first, dice, vt),
                   len(dice))  # fmt: skip

    def scores(self, src: pa.Array, tgt: pa.Array) -> np.ndarray:
        """Each pair's score (float64): the mean of its coverages one way and the other
        (of the one, when the other side has no word of weight the table knows; 1 when
        neither has)."""
        s, t = words(src, self.src_vocab), words(tgt, self.tgt_vocab)
        n = len(src)
        ways = [
            _coverage(s, t, self.forward, self.src_weight, len(self.tgt_vocab), n),
            _coverage(t, s, self.backward, self.tgt_weight, len(self.src_vocab), n),
        ]
        shares = sum(np.divide(hit, total, out=np.zeros(n), where=total > 0)
                     for hit, total in ways)  # fmt: skip
        known = sum((total > 0).astype(np.float64) for _, total in ways)
        return np.divide(shares, known, out=np.ones(n), where=known > 0)


def cooccurrences(s: Words, t: Words, pairs: int, vt: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct s * vt + t of every source word s and target word t of the same pair,
    sorted; in how many pairs each occurs): np.unique's answer, counted COUNT_BLOCK pairs at
    a time and merged, so memory holds the distinct ones and not every co-occurrence (63M
    for 100,000 pairs of 25 words a side, against 5.9M distinct)."""
    keys, counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for a in range(0, pairs, COUNT_BLOCK):
        b = min(a + COUNT_BLOCK, pairs)
        block = [_rows(w, a, b) for w in (s, t)]
        met = np.sort(_cooccurring(*block, b - a, vt))
        new, many = _runs(met, np.ones(len(met), dtype=np.int64))
        at = np.searchsorted(keys, new)  # added in place where met before, inserted if not
        known = at < len(keys)
        known[known] = keys[at[known]] == new[known]
        counts[at[known]] += many[known]
        keys = np.insert(keys, at[~known], new[~known])
        counts = np.insert(counts, at[~known], many[~known])
    return keys, counts


def _rows(w: Words, a: int, b: int) -> Words:
    """The words of rows a to b (numbered from 0)."""
    lo, hi = np.searchsorted(w.rows, [a, b])
    return Words(w.rows[lo:hi] - a, w.ids[lo:hi])


def _runs(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted `keys` with their `counts`: each distinct key once, its counts summed."""
    if not len(keys):
        return keys, counts
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.add.reduceat(counts, starts)


def _cooccurring(s: Words, t: Words, pairs: int, vt: int) -> np.ndarray:
    """s * vt + t for every source word s and target word t of the same pair."""
    nt = np.bincount(t.rows, minlength=pairs)
    t_start = np.concatenate(([0], np.cumsum(nt)[:-1]))
    sizes = nt[s.rows]  # each source word meets its pair's target words
    total = int(sizes.sum())
    group = np.repeat(np.cumsum(sizes) - sizes, sizes)
    within = np.arange(total, dtype=np.int64) - group
    targets = t.ids[np.repeat(t_start[s.rows], sizes) + within]
    return np.repeat(s.ids, sizes) * vt + targets


def _coverage(s: Words, t: Words, table: tuple, weight: np.ndarray, vt: int, n: int) -> tuple:
    """(each pair's weight of source words the table translates into its target, of the
    source words the table knows)."""
    starts, translations = table
    size = starts[s.ids + 1] - starts[s.ids]
    known = size > 0
    rows, ids, size = s.rows[known], s.ids[known], size[known]
    group = np.repeat(np.cumsum(size) - size, size)
    within = np.arange(int(size.sum()), dtype=np.int64) - group
    candidates = translations[np.repeat(starts[ids], size) + within]
    wanted = np.repeat(rows, size) * vt + candidates
    present = t.rows * vt + t.ids  # sorted
    at = np.minimum(np.searchsorted(present, wanted), max(len(present) - 1, 0))
    found = present[at] == wanted if len(present) else np.zeros(len(wanted), dtype=bool)
    entry = np.repeat(np.arange(len(ids)), size)
    covered = np.bincount(entry, weights=found, minlength=len(ids)) > 0
    w = weight[ids]
    total = np.bincount(rows, weights=w, minlength=n)
    hit = np.bincount(rows, weights=w * covered, minlength=n)
    return hit, total


def sample_rows(pairs: int) -> np.ndarray:
    """The rows the table is learnt from: all, or SAMPLE of them drawn (seeded), in order."""
    if pairs <= SAMPLE:
        return np.arange(pairs)
    return np.sort(np.random.default_rng(SEED).choice(pairs, SAMPLE, replace=False))
