"""The rules of data/clean.py applied to a part of a split, with every dropped pair accounted
for: counted by reason (the manifest's `dropped`, the table `mtx prepare` prints) and written
once, with its reason, to RUN/prepared/dropped.tsv:

    split  set  line  reason  source  target

(`line`: the pair's 1-based line in its source, or its row in a hub dataset; the sides as
the rules saw them, whitespace collapsed). The order: per-pair rules (in data.workers
processes), duplicates (one pass, in order), the lexical rule (data/lexical.py), the dual
cross-entropy filter, then, after encoding, the length rules (`keep_by_length`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.arrow_writer import ArrowWriter

from mtx.config import DataConfig
from mtx.data import lexical
from mtx.data.clean import (
    BATCH,
    KEY_BYTES,
    LENGTH_REASONS,
    PAIR_RULES,
    PairCleaner,
    Rules,
    length_reasons,
)

# (sources, targets, src_lang, tgt_lang) -> each pair's dual conditional cross-entropy score
DualScorer = Callable[[list[str], list[str], str, str], list[float]]  # jobs/dual.py


def order() -> tuple[str, ...]:
    """Every reason a pair is dropped for, in the order the rules meet it: the per-pair rules
    of clean.py's table (PAIR_RULES), then the stages of this module."""
    rules = (r.name for r in PAIR_RULES)
    return ("empty", *rules, "langid", "duplicate", "lexical", "dual", "too_long", "ratio")


class Dropped:
    """dropped.tsv, written as the parts are cleaned."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by prepare)
        self.file.write("split\tset\tline\treason\tsource\ttarget\n")

    def write(self, where: str, line: int, reason: str, src: str, tgt: str) -> None:
        self.file.write(f"{where}\t{line}\t{reason}\t{src}\t{tgt}\n")

    def close(self) -> None:
        self.file.close()


def take(ds: datasets.Dataset, rows: np.ndarray, path: Path) -> datasets.Dataset:
    """The rows of `ds` in this order, gathered by Arrow a block at a time into the Arrow
    file `path` and memory-mapped from it. datasets' `select` would leave an indices mapping,
    through which every later read (SentencePiece's sample, the encoder, the writing) gathers
    its rows one at a time in Python. `ds` is a map's output (no indices mapping)."""
    if ds._indices is not None:  # its table's rows are not its rows
        raise ValueError("filtering.take needs a dataset without an indices mapping")
    with ArrowWriter(features=ds.features, path=str(path)) as writer:
        for part in take_rows(ds.data.table, rows):
            writer.write_table(part)
        writer.finalize()
    return datasets.Dataset.from_file(str(path))


def take_rows(table: pa.Table, rows: np.ndarray) -> Iterator[pa.Table]:
    """The `rows` of `table` (ascending), a record batch's at a time, in order. Arrow's
    `Table.take` would first join every chunk of each column into one array in memory (the
    whole memory-mapped text: 1.9 GiB of anonymous memory at 4.5M pairs)."""
    if len(rows) > 1 and (np.diff(rows) < 0).any():
        raise ValueError("take_rows takes rows in ascending order")
    start = 0
    for batch in table.to_batches():
        end = start + batch.num_rows
        lo, hi = np.searchsorted(rows, [start, end])
        if hi > lo:
            yield pa.Table.from_batches([batch.take(pa.array(rows[lo:hi] - start))])
        start = end


def _file(cache: Path, stage: str, where: str) -> Path:
    """A stage's Arrow file for a part ("train\tNAME") in the cache folder."""
    return cache / f"{stage}-{where.replace(chr(9), '-')}.arrow"


def rules(d: DataConfig, src_lang: str, tgt_lang: str, log) -> Rules:
    """The training split's per-pair rules, as data.clean sets them; a language the
    identifier does not know is said and its side left unchecked."""
    c = d.clean
    if c.langid:
        from mtx.data.langid import LanguageId

        lid = LanguageId()
        for lang in (src_lang, tgt_lang):
            if not lid.knows(lang):
                log(f"data.clean.langid: py3langid does not know {lang!r}; its side is not checked")
    return Rules.of(c, src_lang, tgt_lang)


def clean_part(
    raw: datasets.Dataset,
    cleaner: PairCleaner,
    workers: int,
    cache: Path,
    where: str,
    dropped: Dropped,
    seconds: Counter,
) -> tuple[datasets.Dataset, Counter]:
    """(the part's kept pairs with their `line`, counts of the pairs read and dropped by
    reason); every dropped pair written to `dropped` under `where` ("train\tNAME")."""
    start = time.perf_counter()
    marked = raw.map(
        cleaner,
        batched=True,
        batch_size=BATCH,
        with_indices=True,
        num_proc=workers if workers > 1 and len(raw) > 1 else None,
        new_fingerprint=_file(cache, "clean", where).stem,
        cache_file_name=str(_file(cache, "clean", where)),
        desc=f"cleaning {where.split(chr(9))[0]}",
    )
    seconds["clean"] += time.perf_counter() - start
    start = time.perf_counter()
    kept, counts = sift(marked, where, dropped)
    marked = marked.remove_columns([c for c in ("reason", "key") if c in marked.column_names])
    if len(kept) < len(marked):
        marked = take(marked, kept, _file(cache, "kept", where))
    seconds["dedup"] += time.perf_counter() - start
    return marked, counts


def sift(marked: datasets.Dataset, where: str, dropped: Dropped) -> tuple[np.ndarray, Counter]:
    """(the rows kept, the counts of pairs read and dropped by reason) of the cleaner's output:
    a pair goes for its `reason`, or as a duplicate when no rule dropped it and an earlier
    such pair has its `key`; each dropped pair is written to `dropped`, in order. The keys are
    compared in numpy (sorted, the earlier first among equals): no Python object per pair,
    whose millions left the heap fragmented (1.6 GiB at 4.5M pairs)."""
    table = marked.data.table  # a map's output: its rows are the dataset's
    ruled = pc.not_equal(table.column("reason"), "").to_numpy(zero_copy_only=False)
    duplicate = np.zeros(len(ruled), dtype=bool)
    if "key" in table.column_names and len(ruled):
        free = np.flatnonzero(~ruled)
        keys = _keys(table.column("key"))[free]
        high, low = keys[:, :8].copy().view("<u8")[:, 0], keys[:, 8:].copy().view("<u4")[:, 0]
        order = np.lexsort((low, high))  # stable: of equal keys, the earlier row first
        high, low = high[order], low[order]
        again = (high[1:] == high[:-1]) & (low[1:] == low[:-1])
        duplicate[free[order[1:][again]]] = True
    counts: Counter[str] = Counter(read=len(ruled))
    gone = np.flatnonzero(ruled | duplicate)
    for block in take_rows(table.select(["src", "tgt", "reason", "line"]), gone):
        src, tgt, reason, line = (block.column(c).to_pylist() for c in block.column_names)
        for s, t, why, n in zip(src, tgt, reason, line, strict=True):
            why = why or "duplicate"
            counts[why] += 1
            dropped.write(where, n, why, s, t)
    return np.flatnonzero(~(ruled | duplicate)), counts


def _keys(column: pa.ChunkedArray) -> np.ndarray:
    """The cleaner's 12-byte pair keys as rows of a (pairs, 12) uint8 array."""
    width = KEY_BYTES
    parts = []
    for chunk in pc.cast(column, pa.binary(width)).chunks:
        data = np.frombuffer(chunk.buffers()[1], dtype=np.uint8)
        parts.append(data[chunk.offset * width : (chunk.offset + len(chunk)) * width])
    return np.concatenate(parts).reshape(-1, width) if parts else np.zeros((0, width), np.uint8)


def corpus_rules(
    text: datasets.Dataset, d: DataConfig, langs: tuple[str, str], dual: DualScorer | None,
    where: str, dropped: Dropped, cache: Path, seconds: Counter, log,
) -> tuple[datasets.Dataset, Counter]:  # fmt: skip
    """The rules that judge a pair by the whole part, after the per-pair rules and
    duplicates: the lexical rule, then the dual cross-entropy filter, as data.clean sets them."""
    counts: Counter[str] = Counter()
    if d.clean.lexical:
        start = time.perf_counter()
        if len(text) >= lexical.MIN_PAIRS:
            log(f"{where.split(chr(9))[0]}: lexical rule over {len(text):,} pairs")
        text, lexed = lexical_filter(text, d.clean.lexical, where, dropped, cache, log)
        counts.update(lexed)
        if lexed:  # a stage of its own when it ran (a small part is not filtered)
            seconds["lexical"] += time.perf_counter() - start
    if d.clean.dual_forward and len(text):
        start = time.perf_counter()
        text, scored = dual_filter(text, d, langs, dual, where, dropped, cache, log)
        counts.update(scored)
        seconds["dual"] += time.perf_counter() - start
    return text, counts


def dual_filter(
    text: datasets.Dataset,
    d: DataConfig,
    langs: tuple[str, str],
    score: DualScorer,
    where: str,
    dropped: Dropped,
    cache: Path,
    log,
) -> tuple[datasets.Dataset, Counter]:
    """The pairs whose dual conditional cross-entropy score is at most data.clean.dual_threshold
    or, without one, the data.clean.dual_keep best-scored (ties kept by their order)."""
    log(f"{where.split(chr(9))[0]}: scoring {len(text)} pairs both ways (data.clean.dual_*)")
    scores = np.asarray(score(text["src"], text["tgt"], *langs), dtype=np.float64)
    c = d.clean
    if c.dual_threshold:
        keep = scores <= c.dual_threshold
    else:
        n = int(round(c.dual_keep * len(scores)))
        keep = np.zeros(len(scores), dtype=bool)
        keep[np.argsort(scores, kind="stable")[:n]] = True
    threshold = scores[keep].max() if keep.any() else float("nan")
    log(
        f"{where.split(chr(9))[0]}: dual cross-entropy kept {int(keep.sum())} of {len(scores)} "
        f"pairs (score at most {threshold:.3f}; median {np.median(scores):.3f})"
    )
    return _keep(text, keep, "dual", where, dropped, cache)


def _keep(
    text: datasets.Dataset, keep: np.ndarray, reason: str, where: str, dropped: Dropped, cache: Path
) -> tuple[datasets.Dataset, Counter]:
    """(the rows of `text` that `keep` marks, the count of the others), each of the others
    written to `dropped` with `reason`."""
    drop = np.flatnonzero(~keep)
    if not len(drop):
        return text, Counter({reason: 0})
    _write_dropped(text, drop, [reason] * len(drop), where, dropped)
    kept = take(text, np.flatnonzero(keep), _file(cache, reason, where))
    return kept, Counter({reason: len(drop)})


def _write_dropped(
    ds: datasets.Dataset, rows: np.ndarray, reasons: list[str], where: str, dropped: Dropped
) -> None:
    """The pairs at `rows` (ascending) of `ds` (a map's or take's output) written to `dropped`
    with their `reasons`, in order."""
    if ds._indices is not None:
        raise ValueError("the dropped rows are read from a dataset without an indices mapping")
    done = 0
    for block in take_rows(ds.data.table.select(["src", "tgt", "line"]), rows):
        src, tgt, line = (block.column(c).to_pylist() for c in block.column_names)
        for s, t, n, why in zip(src, tgt, line, reasons[done : done + len(src)], strict=True):
            dropped.write(where, n, why, s, t)
        done += len(src)


def lexical_filter(
    text: datasets.Dataset, threshold: float, where: str, dropped: Dropped, cache: Path, log
) -> tuple[datasets.Dataset, Counter]:
    """The pairs whose lexical score (data/lexical.py) is at least `threshold`: a table of
    translations learnt from (a sample of) these pairs, then every pair scored a block at a
    time. A part of fewer than lexical.MIN_PAIRS pairs is kept whole."""
    name = where.split(chr(9))[0]
    if len(text) < lexical.MIN_PAIRS:
        log(f"{name}: data.clean.lexical: {len(text)} pairs, too few to learn translations "
            f"from (fewer than {lexical.MIN_PAIRS:,}); not filtered")  # fmt: skip
        return text, Counter()
    arrow = text.select_columns(["src", "tgt"]).with_format("arrow")
    sides = text.data.table.select(["src", "tgt"])  # a map's or take's output: its rows
    sample = pa.concat_tables(take_rows(sides, lexical.sample_rows(len(text))))
    table = lexical.Table.learn(sample["src"].combine_chunks(), sample["tgt"].combine_chunks())
    scores = np.concatenate([
        table.scores(block["src"].combine_chunks(), block["tgt"].combine_chunks())
        for block in arrow.iter(batch_size=lexical.BLOCK)
    ])  # fmt: skip
    keep = scores >= threshold
    log(f"{name}: lexical rule: {table.entries:,} translations learnt from {len(sample):,} "
        f"pairs; kept {int(keep.sum())} of {len(keep)} (score at least {threshold}; median "
        f"{np.median(scores):.3f})")  # fmt: skip
    return _keep(text, keep, "lexical", where, dropped, cache)


def keep_by_length(
    ds: datasets.Dataset, max_len: int, max_ratio: float, where: str, dropped: Dropped, cache: Path
) -> tuple[datasets.Dataset, Counter]:
    """(the pairs of `ds` whose lengths pass, counts of the dropped ones by reason), the
    dropped ones written to `dropped`. A source tag counts as one of the source's subwords."""
    lens = ds.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    codes = length_reasons(lens["src_len"] - 1, lens["tgt_len"] - 1, max_len, max_ratio)  # no EOS
    gone = np.flatnonzero(codes)
    if not len(gone):
        return ds, Counter()
    reasons = [LENGTH_REASONS[c] for c in codes[gone]]
    _write_dropped(ds, gone, reasons, where, dropped)
    kept = take(ds, np.flatnonzero(codes == 0), _file(cache, "length", where))
    return kept, Counter(reasons)


def report(splits: dict, log) -> None:
    """Log the table of the pairs each rule dropped from each split (manifest SplitRecords)."""
    log("pairs dropped, by rule (every one in dropped.tsv):")
    dropped = {k: Counter(v.dropped, read=v.read) for k, v in splits.items()}
    for line in table(dropped, {k: v.kept for k, v in splits.items()}):
        log("  " + line)


def table(dropped: dict[str, Counter], kept: dict[str, int]) -> list[str]:
    """The lines of the table `mtx prepare` prints: pairs dropped by each rule, per split."""
    splits = list(dropped)
    known = order()
    reasons = [r for r in known if any(dropped[s][r] for s in splits)]
    reasons += sorted({r for s in splits for r in dropped[s]} - set(known) - {"read"})
    width = max([len(r) for r in reasons] + [8])
    lines = [f"{'':{width}}" + "".join(f"{s:>10}" for s in splits)]
    for label in ["read", *reasons]:
        lines.append(f"{label:{width}}" + "".join(f"{dropped[s][label]:>10}" for s in splits))
    lines.append(f"{'kept':{width}}" + "".join(f"{kept[s]:>10}" for s in splits))
    return lines
