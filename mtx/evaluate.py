"""Scoring with sacreBLEU: detokenized BLEU and chrF, with their signatures."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

from mtx.errors import MtxError


def score(hyps: list[str], refs: list[str]) -> dict:
    """Corpus BLEU and chrF of detokenized hypotheses against one reference each."""
    if len(hyps) != len(refs):
        raise MtxError(
            f"{len(hyps)} hypotheses but {len(refs)} references; they must be line-aligned"
        )
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "lines": len(hyps),
    }
