"""Dual conditional cross-entropy (Junczys-Dowmunt 2018, "Dual Conditional Cross-Entropy
Filtering of Noisy Parallel Corpora"): `mtx prepare`'s filter for pairs that rules cannot
judge, such as misaligned ones.

A forward model (src -> tgt) and a backward model (tgt -> src), both trained on clean data,
score each pair by forced decoding (decode/score.py); with H_f = -log p(y | x) / |y| and
H_b = -log p(x | y) / |x| (nats per token, EOS included),

    score = |H_f - H_b| + (H_f + H_b) / 2

is low when both models find the pair likely and agree about it. The forward model is
data.clean.dual_forward; the backward one data.clean.dual_backward, or the same checkpoint
when it translates both ways (a data.corpora model with language tags). A pair with a side
longer than a model takes scores +inf (dropped by the filter: Scorer.cross_entropies' policy).
"""

from __future__ import annotations

from pathlib import Path

from mtx import corpora
from mtx.config import CleanConfig, DataConfig
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.errors import MtxError


def _model(path: str, key: str) -> Translator:
    if not Path(path).is_file():
        raise MtxError(f"{key}: no such checkpoint: {path}")
    return Translator.from_checkpoints(path)


def _into(tr: Translator, lang: str, key: str, path: str) -> Scorer:
    """A scorer of `tr` translating into `lang`, or a one-line error naming `key`."""
    languages = tr.parts.codec.languages
    if lang not in languages.targets:
        raise MtxError(
            f"{key} {path} translates into {', '.join(languages.targets)}, not {lang}"
            + ("" if key.endswith("backward") else " (set data.clean.dual_backward too)")
        )
    return Scorer(tr.parts, lang if languages.needs_target else None)


class DualCrossEntropy:
    """The dual score of pairs of one direction: `scores(sources, targets, src_lang,
    tgt_lang)`, as data/filtering.py's DualScorer. Both models are loaded here, once."""

    def __init__(self, c: CleanConfig) -> None:
        self.forward = _model(c.dual_forward, "data.clean.dual_forward")
        self.paths = (c.dual_forward, c.dual_backward or c.dual_forward)
        self.backward = (
            _model(c.dual_backward, "data.clean.dual_backward") if c.dual_backward else self.forward
        )

    def scorers(self, src_lang: str, tgt_lang: str) -> tuple[Scorer, Scorer]:
        """(forward, backward) for a direction, or a one-line error if a model cannot."""
        fwd_key = "data.clean.dual_forward"
        bwd_key = "data.clean.dual_backward" if self.paths[0] != self.paths[1] else fwd_key
        forward = _into(self.forward, tgt_lang, fwd_key, self.paths[0])
        return forward, _into(self.backward, src_lang, bwd_key, self.paths[1])

    def check(self, d: DataConfig) -> None:
        """Refuse, before any work, a direction of the training data the models cannot score."""
        for c in corpora.corpora(d):
            self.scorers(c.src_lang, c.tgt_lang)

    def __call__(
        self, sources: list[str], targets: list[str], src_lang: str, tgt_lang: str
    ) -> list[float]:
        forward, backward = self.scorers(src_lang, tgt_lang)
        h_f = forward.cross_entropies(sources, targets)
        h_b = backward.cross_entropies(targets, sources)
        return [abs(f - b) + (f + b) / 2 for f, b in zip(h_f, h_b)]
