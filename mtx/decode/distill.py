"""Sequence-level distillation data (Kim and Rush 2016): a teacher's translations of the
training sources, scored by the teacher, the worst fraction dropped, written as a corpus.

    mtx distill --checkpoint T.pt [--checkpoint T2.pt] --src train.en --output-dir DIR \
        [--drop-worst 0.05] [--resume]

1. The teacher (one checkpoint or an ensemble) translates the sources into DIR/teacher.TGT
   (corpus.py: chunk by chunk, resumable after a kill with --resume).
2. It scores each (source, translation) pair (score.py): the cross-entropy of the translation,
   minus its mean log-probability per target token.
3. The `drop_worst` fraction of pairs with the highest cross-entropy are dropped (ties: the
   later line first), and the rest written, in input order, as DIR/distilled.SRC and
   DIR/distilled.TGT: a local corpus that `mtx prepare` reads as `data.train: DIR/distilled`
   (or a `data.corpora` entry, beside the original data to mix them).
4. DIR/distill.json says what was done: the counts, the threshold, the cross-entropies kept and
   dropped, the teacher.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from mtx.data.sources import read_lines
from mtx.decode.score import Scorer
from mtx.errors import MtxError
from mtx.files import atomic_write_text

SCORE_CHUNK = 20_000  # pairs scored at a time (their per-token scores are then let go)


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


def cross_entropies(scorer: Scorer, sources: list[str], targets: list[str]) -> list[float]:
    """Each pair's cross-entropy (minus the mean log-probability per target token)."""
    out: list[float] = []
    for i in range(0, len(sources), SCORE_CHUNK):
        scores = scorer.score(sources[i : i + SCORE_CHUNK], targets[i : i + SCORE_CHUNK])
        out += [-s.mean for s in scores]
    return out


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


def write_corpus(
    out_dir: Path, langs: tuple[str, str], sources, targets, keep, xent, drop_worst, teacher
) -> Report:
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
        translations=str(out_dir / f"teacher.{tgt_lang}"),
        corpus=str(prefix),
    )
    atomic_write_text(out_dir / "distill.json", json.dumps(asdict(report), indent=1) + "\n")
    return report


def distill(
    translator, src: Path, out_dir: Path, langs: tuple[str, str], drop_worst: float,
    translate, teacher: list[str],
) -> Report:  # fmt: skip
    """Steps 2 to 4 after `translate(output path)` (step 1, corpus.py) has written the
    teacher's translations of `src` into DIR/teacher.TGT."""
    if not 0 <= drop_worst < 1:
        raise MtxError(f"--drop-worst must be in [0, 1), got {drop_worst}")
    out_dir.mkdir(parents=True, exist_ok=True)
    hyps_path = out_dir / f"teacher.{langs[1]}"
    translate(hyps_path)
    sources, targets = list(read_lines(src)), list(read_lines(hyps_path))
    if len(sources) != len(targets):
        raise MtxError(f"{hyps_path} has {len(targets)} lines but {src} has {len(sources)}")
    xent = cross_entropies(Scorer(translator), sources, targets)
    keep = kept_lines(xent, drop_worst)
    return write_corpus(out_dir, langs, sources, targets, keep, xent, drop_worst, teacher)
