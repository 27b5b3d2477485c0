"""What `mtx serve`'s own process (the HTTP side) knows of the engine: no torch, no model.

The decoding processes (workers.py) hold the model and decode; the first of them, once its
engine is built, describes it in an `About`: the settings, the SentencePiece model, the
longest source the model takes, the device and `mtx info` of each checkpoint. The server's
process turns that into a `Front`, which counts each text's source tokens exactly as the
translator does (for the batch budget), and answers /info. It never imports torch, so it holds
a few tens of MB rather than torch's hundreds (BENCHMARKS.md, "Serving").

`Choices` and `Result` are what travels between the two: a batch's decoding choices, and one
text's answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtx.config import Config
from mtx.data import vocab
from mtx.decode import dispatch
from mtx.decode.controls import Line, segment
from mtx.decode.languages import Languages
from mtx.decode.result import Translation
from mtx.errors import MtxError
from mtx.tokens import SPECIALS, encode_line, longest_output

ENGINES = ("mtx", "ctranslate2")


@dataclass(frozen=True)
class Choices:
    """A request's decoding choices: only jobs with equal choices share a batch."""

    beam: int
    nbest: int
    attention: bool = False  # also the attention of each translation (for the page)
    tgt_lang: str | None = None  # the language to translate into (None: the model's one)
    alignments: bool = False  # also each translation's word alignment (decode/align.py)


@dataclass
class Result:
    """One text's answer: its translation (decode/result.py) and what the server counts."""

    translation: Translation
    ids: list[int] = field(default_factory=list)  # the best translation's subword ids
    tokens_in: int = 0  # source subwords, EOS included
    attention: dict | None = None  # MtxEngine.attention's, when the request asks for it


@dataclass(frozen=True)
class About:
    """An engine as the first decoding process built it (engine.py's `describe_engine`)."""

    engine: str  # one of ENGINES
    cfg: Config  # the first checkpoint's, with the --set overrides
    spm_proto: bytes  # the vocabulary (data/vocab.py)
    max_positions: int  # the longest source every model takes (an ensemble's: all of them)
    single_model: bool  # one checkpoint and mtx's engine: the attention for the page
    device: str  # "cpu" or "cuda"
    checkpoints: list[dict]  # what `mtx info --json` says of each


class Front:
    """The engine's settings and tokenizer in the server's own process."""

    def __init__(self, about: About) -> None:
        self.name, self.cfg, self.single_model = about.engine, about.cfg, about.single_model
        self.max_positions, self.device = about.max_positions, about.device
        self.vocab = vocab.load(about.spm_proto)
        self.langs = Languages.of(self.vocab, about.cfg.data)  # the translator's scheme
        self.languages = list(self.langs.targets)

    def length(self, text: str) -> int:
        """Source subwords of `text`, EOS (and a tag, or an NLLB model's source code) included:
        what the token budget counts."""
        prefix = self.langs.any_prefix()
        return len(encode_line(self.vocab.source, text, self.max_positions, prefix))

    def check_controls(self, line: Line, where: str) -> None:
        """Refuse, naming `where`, controls the translator would refuse: a search that does
        not take them (decode/dispatch.py; CTranslate2's takes none), or controls that cannot
        be honoured (controls.segment)."""
        if line.controls and self.name != "mtx":
            missing = next(iter(line.controls))
            raise MtxError(f"{where}: --engine {self.name} takes no {missing} (--engine mtx does)")
        d, limit = self.cfg.decode, self.max_positions - 1
        dispatch.check(line.controls, d, where, self.device)
        longest = longest_output(self.length(line.text) - 1, d.max_len_a, d.max_len_b, limit)
        never = SPECIALS[self.cfg.model.decoder_start].never_below
        try:
            segment(line.controls, self.vocab.target.encode, never, longest)
        except MtxError as e:
            raise MtxError(f"{where}: {e}") from None

    def check_language(self, lang: str | None) -> str:
        """Why a request's tgt_lang cannot be served ("" if it can)."""
        why = self.langs.refusal(lang)
        return f"tgt_lang: {why}" if why else ""


def check_engine(name: str, checkpoints: int, device: str) -> None:
    """What --engine, the number of --checkpoints and --device must agree on."""
    if name not in ENGINES:
        raise MtxError(f"--engine must be one of {', '.join(ENGINES)}, got {name!r}")
    if name == "ctranslate2" and checkpoints > 1:
        raise MtxError("--engine ctranslate2 serves one --checkpoint (no ensembles)")
    if name == "ctranslate2" and device not in ("auto", "cpu"):
        raise MtxError("--engine ctranslate2 runs on the CPU here (--device cpu)")
