"""What a request asks of its translation besides its text and controls: one typed record,
`Options`, declared once here, carried whole from the door (`mtx translate`'s options, a JSON
request to `mtx serve`, a corpus job's record) to the engine that decodes (engines.py).

    options = translator.options(beam=1, nbest=1, alignments=True)  # checked: one line if not
    translator.translate(["Ein Hund."], options)

A field that is also a `decode.*` setting takes its type, default, description and range from
that setting's declaration (config/decode.py): the config says what a translator does unless
a request asks otherwise. The others are a request's alone (`nbest`, `tgt_lang`, `attention`,
`draft`). Every field is checked against its declaration when the record is made (a value
out of range, a word not among its choices: one line naming the field), and the rules that tie
fields together are `__post_init__`'s; what depends on the model and its settings (a target
language, alignments from an ensemble, drafts at a beam above 1) is the engine table's
(engines.py `check`).

A request's controls (a prefix, constraints: controls.py) are a sentence's; its options are
the request's, for every sentence of it. This module imports no torch: the server's own process
reads requests with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mtx.config import DecodeConfig
from mtx.config.decode import Format, Stopping
from mtx.config.fields import AT_LEAST_1, check_fields, setting
from mtx.errors import MtxError

_DECODE = {f.name: f for f in dataclasses.fields(DecodeConfig)}


def decode_setting(name: str) -> Any:
    """A field declared by the decode.* setting `name`: its default, description and range."""
    declared = _DECODE[name]
    return dataclasses.field(
        default=declared.default, metadata={**declared.metadata, "setting": name}
    )


@dataclass(frozen=True)
class Options:
    """What a request asks of its translation (see the module's docstring)."""

    beam: int = decode_setting("beam")
    nbest: int = setting(
        1, "the hypotheses given for each sentence, best first (with sampling: samples)",
        AT_LEAST_1,
    )  # fmt: skip
    alpha: float = decode_setting("alpha")
    max_len_a: float = decode_setting("max_len_a")
    max_len_b: int = decode_setting("max_len_b")
    stopping: Stopping = decode_setting("stopping")
    sampling: bool = decode_setting("sampling")
    temperature: float = decode_setting("temperature")
    top_k: int = decode_setting("top_k")
    top_p: float = decode_setting("top_p")
    seed: int = decode_setting("seed")
    tgt_lang: str | None = setting(
        None, "the language to translate into (None: the model's one; a model with several "
        "needs one)",
    )  # fmt: skip
    alignments: bool = decode_setting("alignments")
    attention: bool = setting(
        False, "also each translation's encoder-decoder attention (one model: model/capture.py)"
    )
    format: Format = decode_setting("format")
    draft: bool | None = setting(
        None,
        "greedy search with the draft model's proposals (decode.draft; the same output): "
        "None where it runs (beam 1, no controls), True asked (refused where it cannot), "
        "False never",
        neutral=True,
    )

    def __post_init__(self) -> None:
        check_fields(self, "")
        if not self.sampling and self.nbest > self.beam:
            raise MtxError(
                f"nbest {self.nbest} needs a beam of at least {self.nbest} (or sampling)"
            )

    @classmethod
    def of(cls, decode: DecodeConfig, **given: Any) -> Options:
        """The options of a translator whose settings are `decode` (its decode.* section),
        with the fields `given`; MtxError naming the first that is not valid."""
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise MtxError(f"no option named {unknown[0]!r} (options: {', '.join(names())})")
        defaults = {
            f.name: getattr(decode, f.metadata["setting"])
            for f in dataclasses.fields(cls)
            if "setting" in f.metadata
        }
        return cls(**(defaults | given))

    @property
    def documents(self) -> bool:
        """Whether a text is a document (a format other than plain: mtx/documents/)."""
        return self.format != "plain"

    def sentences(self, **changes: Any) -> Options:
        """These options for each sentence of a document (format plain), with `changes`."""
        return self.replace(format="plain", **changes)

    def replace(self, **changes: Any) -> Options:
        """These options with `changes`, checked."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any], where: str) -> Options:
        """Options as `to_json` wrote them, or MtxError naming `where`."""
        try:
            return cls(**value)
        except (TypeError, MtxError) as e:
            raise MtxError(
                f"{where}: the options recorded there are not this mtx's ({e})"
            ) from None

    def recorded(self) -> dict[str, Any]:
        """The fields that change an output (a corpus job records them: jobs/corpus.py)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not f.metadata.get("neutral")
        }


def names() -> tuple[str, ...]:
    """Every option's name, in order."""
    return tuple(f.name for f in dataclasses.fields(Options))


def recorded_settings(decode: DecodeConfig) -> dict[str, Any]:
    """The decode.* settings that change an output (those not declared `neutral`), by name."""
    return {
        f.name: getattr(decode, f.name)
        for f in dataclasses.fields(decode)
        if not f.metadata.get("neutral")
    }
