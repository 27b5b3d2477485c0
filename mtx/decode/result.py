"""What translating one sentence gives, declared once: its hypotheses as text (`Output`) and
the sentence's result (`Translation`), with the one JSON form that `mtx translate --json`,
corpus translation and `mtx serve` ("results") answer:

    {"translation": "Der Hund läuft.", "score": -0.41, "log_prob": -0.87, "unmet": 0,
     "alignments": [[0, 0], [1, 1], [2, 2]],
     "nbest": [{"translation": ..., "score": ..., "log_prob": ..., "unmet": ...}, ...],
     "alternatives": [{...}, ...]}

`translation`, `score`, `log_prob` and `unmet` are the best hypothesis's: its text, what the
search ranked it by (its log-probability over a length penalty), its log-probability, and how
many of the sentence's constraints it lacks (0 without constraints); `nbest` comes with n-best
output (n > 1), the n best hypotheses in that form, best first; `alternatives` where the
sentence asked for alternatives, each in that form, best first; `alignments`, where asked
(decode.alignments), the [source word, output word] links of each hypothesis, both counted
from 0 on whitespace tokens (decode/align.py). A score or log-probability
that an engine does not give (a text with no words in `mtx serve`, CTranslate2's
log-probability) is null. A field a later feature adds to each sentence's result is added here.
This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Output:
    """One hypothesis as text."""

    text: str
    score: float | None = None
    log_prob: float | None = None
    unmet: int = 0
    links: tuple[tuple[int, int], ...] | None = None  # word alignment, where asked
    tokens: tuple[int, ...] = ()  # its output ids, without EOS (not in the JSON form)

    def to_json(self) -> dict:
        out = {
            "translation": self.text,
            "score": self.score,
            "log_prob": self.log_prob,
            "unmet": self.unmet,
        }
        if self.links is not None:
            out["alignments"] = [list(link) for link in self.links]
        return out

    def pharaoh(self) -> str:
        """Its word alignment as Pharaoh text: `0-0 1-2` (source-output word indices)."""
        return " ".join(f"{i}-{j}" for i, j in self.links or ())

    def nbest_line(self, number: int, aligned: bool = False) -> str:
        """Its line in an n-best list: 'LINE ||| TEXT ||| SCORE ||| LOG-PROBABILITY' (LINE: the
        input line's number from 0), with ' ||| 0-0 1-2' after it if `aligned`."""
        score, log_prob = (
            f"{x:.6f}" if x is not None else "nan" for x in (self.score, self.log_prob)
        )
        line = f"{number} ||| {self.text} ||| {score} ||| {log_prob}"
        return line + (f" ||| {self.pharaoh()}" if aligned else "") + "\n"


@dataclass(frozen=True)
class Attention:
    """The encoder-decoder attention of one translation: the source and output subwords (each
    ending with EOS) and `weights`, a float32 tensor (decoder layers, heads, outputs,
    sources) whose row t is the attention when predicting output subword t."""

    source: list[str]
    output: list[str]
    weights: Any  # a torch.Tensor (this module imports no torch)

    def mean(self) -> Any:
        """(outputs, sources): averaged over decoder layers and heads."""
        return self.weights.mean(dim=(0, 1))

    def to_json(self) -> dict:
        """{"source", "output", "weights": the mean's rows}: what `mtx serve` answers."""
        return {"source": self.source, "output": self.output, "weights": self.mean().tolist()}


@dataclass(frozen=True)
class Translation:
    """One sentence's result: its hypotheses, best first (the n best, or the alternatives it
    asked for). Not in its JSON form: `notes`, what the input's reading repaired or warns of
    (said on stderr by `mtx translate`, answered as `repairs` by `mtx serve`), and
    `attention` where asked."""

    outputs: tuple[Output, ...]
    alternatives: bool = False  # `outputs` are the alternatives the sentence asked for
    notes: tuple[str, ...] = ()
    attention: Attention | None = None

    @classmethod
    def empty(cls, nbest: int = 1) -> Translation:
        """A text with no words: the empty translation, not decoded (scores null), `nbest`
        times (an n-best list holds n)."""
        return cls((Output(""),) * nbest)

    @property
    def best(self) -> Output:
        return self.outputs[0]

    def to_json(self, nbest: int = 1) -> dict:
        """The one JSON form of a result (the module's docstring); `nbest`: how many of the
        hypotheses the caller asked for."""
        out = self.best.to_json()
        if self.alternatives:
            out["alternatives"] = [o.to_json() for o in self.outputs]
        elif nbest > 1:
            out["nbest"] = [o.to_json() for o in self.outputs[:nbest]]
        return out


EMPTY = Translation.empty()  # a text with no words, not decoded
