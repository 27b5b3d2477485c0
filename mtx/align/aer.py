"""Alignment error rate, precision and recall (Och and Ney 2003), over a corpus:

    precision = |A & P| / |A|,   recall = |A & S| / |S|,
    AER = 1 - (|A & S| + |A & P|) / (|A| + |S|)

A the predicted links, S the gold sure links, P the gold possible links (sure included), each
summed over the sentence pairs before dividing (the convention of the published figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtx.align.links import Alignments, Link
from mtx.errors import MtxError


@dataclass(frozen=True)
class AlignmentScores:
    aer: float
    precision: float
    recall: float
    pairs: int
    links: int  # predicted links

    def to_json(self) -> dict:
        return {
            "aer": round(100 * self.aer, 2),
            "precision": round(100 * self.precision, 2),
            "recall": round(100 * self.recall, 2),
            "pairs": self.pairs,
            "links": self.links,
        }


def score(predicted: list[set[Link]], gold: Alignments) -> AlignmentScores:
    """AER, precision and recall of `predicted` (a set of links per pair) against `gold`."""
    if len(predicted) != len(gold):
        raise MtxError(f"{len(predicted)} predicted alignments for {len(gold)} gold ones")
    a = s = a_s = a_p = 0
    for links, sure, possible in zip(predicted, gold.sure, gold.possible):
        a += len(links)
        s += len(sure)
        a_s += len(links & sure)
        a_p += len(links & possible)
    if s == 0:
        raise MtxError("the gold alignments have no sure link")
    aer = 1.0 - (a_s + a_p) / (a + s)
    return AlignmentScores(aer, a_p / a if a else 0.0, a_s / s, len(gold), a)


def reverse(links: list[set[Link]]) -> list[set[Link]]:
    """Each link (i, j) as (j, i): alignments of the pairs read the other way round."""
    return [{(j, i) for i, j in pair} for pair in links]
