"""What `mtx serve`'s own process (the HTTP side) knows of the engine: no torch, no model.

The decoding processes (workers.py) hold the model and decode; the first of them, once its
translator is built, describes it in an `About`: the settings, the SentencePiece model, the
longest source the model takes, its setup as the engine table reads it (decode/engines.py)
and `mtx info` of each checkpoint. The server's process turns that into a `Front`, which
counts each text's source tokens exactly as the translator does (for the batch budget), checks
each request against the engine table as the translator would, and answers /info. It never
imports torch, so it holds a few tens of MB rather than torch's hundreds (BENCHMARKS.md,
"Serving").

A request's options (decode/options.py's `Options`) and `Result` are what travels between the
two: the options a batch shares, and one text's answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtx.config import Config
from mtx.data import vocab
from mtx.decode import engines
from mtx.decode.codec import Codec
from mtx.decode.controls import Controls, Line
from mtx.decode.languages import Languages
from mtx.decode.options import Options
from mtx.decode.result import Translation
from mtx.errors import MtxError
from mtx.tokens import SPECIALS, longest_output

ENGINES = ("mtx", "ctranslate2")  # --engine: mtx's own (decode.engine auto) or ctranslate2


@dataclass
class Result:
    """One text's answer: its translation (decode/result.py) and what the server counts."""

    translation: Translation
    ids: list[int] = field(default_factory=list)  # the best translation's subword ids
    tokens_in: int = 0  # source subwords, EOS included
    attention: dict | None = None  # result.py's Attention.to_json, where the request asks


@dataclass(frozen=True)
class About:
    """A translator as the first decoding process built it (engine.py's `describe_engine`)."""

    cfg: Config  # the first checkpoint's, with the --set overrides
    spm_proto: bytes  # the vocabulary (data/vocab.py)
    max_positions: int  # the longest source every model takes (an ensemble's: all of them)
    setup: engines.Setup  # what the engine table reads of it
    checkpoints: list[dict]  # what `mtx info --json` says of each


class Front:
    """The translator's settings, codec and setup in the server's own process."""

    def __init__(self, about: About) -> None:
        self.cfg, self.setup = about.cfg, about.setup
        spm = vocab.load(about.spm_proto)
        languages = Languages.of(spm, about.cfg.data)  # the translator's scheme
        self.codec = Codec(spm, languages, about.max_positions)
        self.languages = list(languages.targets)
        self.name = "ctranslate2" if self.setup.engine == "ctranslate2" else "mtx"

    @property
    def attention(self) -> bool:
        """Whether its translations can come with their attention (the page's heatmap)."""
        ask = engines.Ask(Controls(), Options.of(self.cfg.decode, attention=True), self.setup)
        engine = engines.choose(ask.controls, ask.options, self.setup)
        return not engines.asked_of_outputs(ask, engine)

    def length(self, text: str) -> int:
        """Source subwords of `text`, EOS (and a tag, or an NLLB model's source code) included:
        what the token budget counts."""
        return self.codec.length(text)

    def options(self, **given) -> Options:
        """A request's options: the settings but for `given`, checked as the translator
        checks them (decode/engines.py)."""
        options = Options.of(self.cfg.decode, **given)
        engines.check(Controls(), options, self.setup)
        return options

    def check_controls(self, line: Line, options: Options, where: str) -> None:
        """Refuse, naming `where`, controls the translator would refuse: an engine that does
        not take them (decode/engines.py), or controls that cannot be honoured
        (controls.segment)."""
        limit = self.codec.max_positions - 1
        longest = longest_output(self.length(line.text) - 1, options.max_len_a, options.max_len_b,
                                 limit)  # fmt: skip
        never = SPECIALS[self.cfg.model.decoder_start].never_below
        engines.check_line(line.controls, options, self.setup, self.codec.vocab.target.encode,
                           never, longest, where)  # fmt: skip


def check_engine(name: str) -> None:
    """--engine names one of ENGINES."""
    if name not in ENGINES:
        raise MtxError(f"--engine must be one of {', '.join(ENGINES)}, got {name!r}")
