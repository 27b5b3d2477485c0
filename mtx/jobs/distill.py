"""Sequence-level distillation data (Kim and Rush 2016): a teacher's translations of the
training sources, scored by the teacher, the worst fraction dropped, written as a corpus.

    mtx distill --checkpoint T.pt [--checkpoint T2.pt] --src train.en --output-dir DIR \
        [--drop-worst 0.05] [--ref train.de --nbest 8 --beam 8] [--resume]

1. The teacher (one checkpoint or an ensemble) translates each source line and
2. scores each (source, translation) pair (decode/score.py's `Scorer.cross_entropies`): the
   cross-entropy of the translation, minus its mean log-probability per target token. Steps
   1 and 2 are one corpus job (`distill_job`; corpus.py: chunk by chunk, resumable after a
   kill; shards.py: spread over torchrun's processes), one JSON object a line in
   DIR/teacher.TGT.jsonl, from which `finish` writes DIR/teacher.TGT and steps 3 and 4.
3. The `drop_worst` fraction of pairs with the highest cross-entropy are dropped (ties: the
   later line first), and the rest written, in input order, as DIR/distilled.SRC and
   DIR/distilled.TGT: a local corpus that `mtx prepare` reads as `data.train: DIR/distilled`
   (or a `data.corpora` entry, beside the original data to mix them).
4. DIR/distill.json says what was done: the counts, the threshold, the cross-entropies kept and
   dropped, the teacher.

With the training targets (`--ref train.de --nbest N`), step 1 keeps the teacher's N best
translations of each line (DIR/teacher.TGT.nbest) and each line's translation is the one of
them closest to its reference by sentence-level BLEU or chrF (`--select`; of equal ones, the
teacher's better), written to DIR/closest.TGT (teacher.TGT stays the 1-best file of a run
without --ref): Kim and Rush's sequence-level interpolation, and what Firefox Translations
does with its teachers' 8-best lists. The teacher still speaks for every target, but picks
the way of saying it that the human translation took.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mtx.data.sources import count_lines, read_lines
from mtx.decode.score import Scorer
from mtx.errors import MtxError
from mtx.evaluate import SENTENCE_METRICS, sentence_metric
from mtx.files import atomic_write_text
from mtx.jobs.corpus import CorpusJob, Record


@dataclass
class Selection:
    """What to choose each line's translation by: the `nbest` best, the one closest to its line
    of `references` by sentence-level `metric`."""

    references: Path
    nbest: int
    metric: str = "bleu"


@dataclass
class Chosen:
    """How the translations were chosen (DIR/distill.json's "chosen")."""

    nbest: int
    metric: str
    references: str
    not_first: int  # lines whose closest translation is not the teacher's best
    mean_first: float  # the sentence metric of the teacher's best, mean over the lines
    mean_chosen: float  # ... of the chosen ones


@dataclass
class Report:
    """DIR/distill.json."""

    pairs: int
    kept: int
    dropped: int
    drop_worst: float
    threshold_cross_entropy: float | None  # the highest kept; None if nothing was dropped
    mean_cross_entropy_kept: float | None
    mean_cross_entropy_dropped: float | None
    teacher: list[str]
    translations: str
    corpus: str  # the prefix for data.train / data.corpora
    chosen: Chosen | None = None  # with --ref: how each line's translation was chosen


def check_drop_worst(drop_worst: float) -> None:
    """Refuse a `drop_worst` outside [0, 1) in one line."""
    if not 0 <= drop_worst < 1:
        raise MtxError(f"--drop-worst must be in [0, 1), got {drop_worst}")


def kept_lines(xent: list[float], drop_worst: float) -> list[bool]:
    """Which lines stay: all but the int(n * drop_worst) of highest cross-entropy (of equal
    ones, the later line goes first)."""
    n = len(xent)
    drop = int(n * drop_worst)
    worst = sorted(range(n), key=lambda i: (xent[i], i), reverse=True)[:drop]
    keep = [True] * n
    for i in worst:
        keep[i] = False
    return keep


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def read_nbest(path: Path, lines: int, n: int) -> Iterator[list[str]]:
    """The `n` translations of each of `lines` input lines, in order, from an n-best file
    ('LINE ||| TEXT ||| SCORE ||| LOG-PROBABILITY', LINE from 0, each line's in the teacher's
    order), one group at a time: a corpus's n-best lists need not fit in memory."""
    group: list[str] = []
    expected = 0
    for number, line in enumerate(read_lines(path), 1):
        fields = line.split(" ||| ")
        if len(fields) < 4 or not fields[0].isdigit():
            raise MtxError(f"{path} line {number}: not 'LINE ||| TEXT ||| SCORE ||| LOG-PROB'")
        if int(fields[0]) != expected:
            raise MtxError(
                f"{path} line {number}: a translation of input line {int(fields[0]) + 1} where "
                f"the {n} of input line {expected + 1} go"
            )
        group.append(" ||| ".join(fields[1:-2]))
        if len(group) == n:
            yield group
            group, expected = [], expected + 1
    if group or expected != lines:
        raise MtxError(f"{path} holds the {n} best of {expected} input lines, not of {lines}")


def closest(
    groups: Iterable[list[str]], refs: list[str], metric: str
) -> tuple[list[int], list[str], list[float], list[float]]:
    """For each group, the index and text of the translation closest to its reference by
    sentence-level `metric` (of equal ones, the earlier: the teacher's better), with the
    metric of its first translation and of the chosen one."""
    similarity = sentence_metric(metric)
    picks, texts, first, chosen = [], [], [], []
    for group, ref in zip(groups, refs, strict=True):
        scores = [similarity(hyp, ref) for hyp in group]
        best = max(range(len(group)), key=lambda j: (scores[j], -j))
        picks.append(best)
        texts.append(group[best])
        first.append(scores[0])
        chosen.append(scores[best])
    return picks, texts, first, chosen


def check_selection(selection: Selection) -> None:
    """--ref's options, refused in one line."""
    if selection.metric not in SENTENCE_METRICS:
        known = ", ".join(SENTENCE_METRICS)
        raise MtxError(f"--select must be one of {known}, got {selection.metric!r}")
    if selection.nbest < 2:
        raise MtxError(f"--ref needs --nbest 2 or more to choose from, got {selection.nbest}")
    if not selection.references.is_file():
        raise MtxError(f"file not found: {selection.references}")


def references(selection: Selection, lines: int) -> list[str]:
    """The references of the `lines` sources, checked before anything is translated."""
    check_selection(selection)
    path = selection.references
    refs = list(read_lines(path))
    if len(refs) != lines:
        raise MtxError(f"{path} has {len(refs)} lines but the sources have {lines}")
    return refs


def write_corpus(
    out_dir: Path, langs: tuple[str, str], sources, targets, keep, xent, drop_worst, teacher,
    translations: Path, chosen: Chosen | None = None,
) -> Report:  # fmt: skip
    """DIR/distilled.{src,tgt} of the kept pairs, and DIR/distill.json."""
    prefix = out_dir / "distilled"
    src_lang, tgt_lang = langs
    kept = [i for i, k in enumerate(keep) if k]
    atomic_write_text(prefix.with_suffix(f".{src_lang}"), "".join(sources[i] + "\n" for i in kept))
    atomic_write_text(prefix.with_suffix(f".{tgt_lang}"), "".join(targets[i] + "\n" for i in kept))
    dropped = [x for x, k in zip(xent, keep) if not k]
    report = Report(
        pairs=len(sources),
        kept=len(kept),
        dropped=len(dropped),
        drop_worst=drop_worst,
        threshold_cross_entropy=max(xent[i] for i in kept) if dropped and kept else None,
        mean_cross_entropy_kept=mean([xent[i] for i in kept]),
        mean_cross_entropy_dropped=mean(dropped),
        teacher=teacher,
        translations=str(translations),
        corpus=str(prefix),
        chosen=chosen,
    )
    atomic_write_text(out_dir / "distill.json", json.dumps(asdict(report), indent=1) + "\n")
    return report


def work_path(out_dir: Path, tgt_lang: str) -> Path:
    """DIR/teacher.TGT.jsonl: each line's translation(s) and cross-entropy, the resumable work."""
    return out_dir / f"teacher.{tgt_lang}.jsonl"


@dataclass(frozen=True)
class Work:
    """One line of the work file (`work_path`): a source line's translation by the teacher and
    its cross-entropy; with a selection, the n best (as n-best lines), which was chosen (0:
    the first) and the sentence metric of the first and of the chosen."""

    translation: str
    nbest: str | None = None
    pick: int | None = None
    first: float | None = None
    chosen: float | None = None
    cross_entropy: float = 0.0

    def line(self) -> str:
        """Its JSON line (the selection's fields only with a selection)."""
        values = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(values, ensure_ascii=False) + "\n"

    @classmethod
    def read(cls, line: str) -> Work:
        return cls(**json.loads(line))


def distill_job(
    translator, src: Path, record: Record, selection: Selection | None, options
) -> CorpusJob:
    """Steps 1 and 2 for each source line, as a corpus job (translate.py; shards.py under
    torchrun): the teacher's translation under `options` (with a `selection`, its n best and
    the one closest to the line's reference, from the job's second input) and its
    cross-entropy, one `Work` line each."""
    scorer = Scorer(translator.parts, options.tgt_lang)

    def render(first: int, rows: list[tuple[str, ...]]) -> list[str]:
        sources = [row[0] for row in rows]
        results = translator.translate(sources, options, first)
        work = [Work(r.best.text) for r in results]
        if selection is not None:
            groups = [[o.text for o in r.outputs] for r in results]
            refs = [row[1] for row in rows]
            picks, texts, first_metric, chosen = closest(groups, refs, selection.metric)
            for i, r in enumerate(results):
                nbest = "".join(o.nbest_line(first + i) for o in r.outputs)
                work[i] = Work(texts[i], nbest, picks[i], first_metric[i], chosen[i])
        xent = scorer.cross_entropies(sources, [w.translation for w in work])
        return [replace(w, cross_entropy=x).line() for w, x in zip(work, xent)]

    inputs = [src] if selection is None else [src, selection.references]
    return CorpusJob(inputs, record, 1, render, verb="distilled", counted=translator.stats)


def finish(
    out_dir: Path, langs: tuple[str, str], src: Path, drop_worst: float, teacher: list[str],
    selection: Selection | None,
) -> Report:  # fmt: skip
    """Steps 3 and 4 from the finished work file: the translations' files (DIR/teacher.TGT; with
    a `selection`, DIR/teacher.TGT.nbest and DIR/closest.TGT), the corpus and DIR/distill.json."""
    tgt = langs[1]
    work = [Work.read(line) for line in read_lines(work_path(out_dir, tgt))]
    targets = [w.translation for w in work]
    xent = [float(w.cross_entropy) for w in work]
    chosen = None
    if selection is None:
        path = out_dir / f"teacher.{tgt}"
    else:
        path = out_dir / f"closest.{tgt}"
        atomic_write_text(out_dir / f"teacher.{tgt}.nbest", "".join(w.nbest or "" for w in work))
        chosen = Chosen(
            nbest=selection.nbest, metric=selection.metric, references=str(selection.references),
            not_first=sum(1 for w in work if w.pick),
            mean_first=mean([w.first for w in work]) or 0.0,
            mean_chosen=mean([w.chosen for w in work]) or 0.0,
        )  # fmt: skip
    atomic_write_text(path, "".join(t + "\n" for t in targets))
    sources = list(read_lines(src))
    keep = kept_lines(xent, drop_worst)
    return write_corpus(
        out_dir, langs, sources, targets, keep, xent, drop_worst, teacher, path, chosen
    )


def check(src: Path, selection: Selection | None, drop_worst: float) -> None:
    """What `mtx distill` is given, refused in one line before anything is written."""
    check_drop_worst(drop_worst)
    if not src.is_file():
        raise MtxError(f"file not found: {src}")
    if selection is not None:
        references(selection, count_lines(src))
