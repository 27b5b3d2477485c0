"""Scoring with sacreBLEU: detokenized BLEU and chrF, with their signatures."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sacrebleu.metrics import BLEU, CHRF

from mtx.errors import MtxError


@dataclass(frozen=True)
class Scores:
    """A corpus's sacreBLEU scores; `to_json` where they are written (`mtx evaluate --json`)."""

    bleu: float  # rounded to 2 decimals, as printed
    chrf: float
    signature: str  # BLEU's
    chrf_signature: str
    bleu_detail: str  # sacreBLEU's line: BLEU = ... (BP = ... ratio = ...)
    lines: int

    def to_json(self) -> dict:
        return asdict(self)


def score(hyps: list[str], refs: list[str]) -> Scores:
    """Corpus BLEU and chrF of detokenized hypotheses against one reference each."""
    if len(hyps) != len(refs):
        raise MtxError(
            f"{len(hyps)} hypotheses but {len(refs)} references; they must be line-aligned"
        )
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    return Scores(
        bleu=round(b.score, 2),
        chrf=round(c.score, 2),
        signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_detail=str(b),
        lines=len(hyps),
    )


SENTENCE_METRICS = ("bleu", "chrf")


def sentence_metric(name: str):
    """`similarity(hyp, ref)`: sentence-level BLEU (with effective order, as sacreBLEU
    recommends for single sentences) or chrF of one hypothesis against one reference."""
    if name not in SENTENCE_METRICS:
        raise MtxError(f"unknown sentence metric {name!r}: one of {', '.join(SENTENCE_METRICS)}")
    metric = BLEU(effective_order=True) if name == "bleu" else CHRF()
    return lambda hyp, ref: metric.sentence_score(hyp, [ref]).score
