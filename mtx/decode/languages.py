"""Which languages a model translates into and how a translation names its target: one object,
`Languages`, that the Translator, the server's own process and the benchmarks ask.

Three schemes, decided once from the vocabulary (data/vocab.py) and the config:
- `tags`: a multilingual mtx or MarianMT model; the source starts with the target language's
  tag (>>de<<, mtx/corpora.py), and a translation must name its target language;
- `codes`: an imported NLLB model; the source starts with the source language's code
  (data.src_lang), and the decoder reads the target language's code after its start token
  (Request.start: data.tgt_lang, or the one named);
- `one`: one target language (the config's), nothing added.

This module imports no torch: the server's process counts source tokens with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mtx import corpora
from mtx.errors import MtxError

Scheme = Literal["tags", "codes", "one"]


@dataclass(frozen=True)
class Languages:
    scheme: Scheme
    ids: dict[str, int]  # tags: {language: its tag's id}; codes: NLLB's {code: id}; one: {}
    targets: tuple[str, ...]  # the languages it translates into, sorted
    src_lang: str  # the config's (data.src_lang)
    tgt_lang: str  # the config's (data.tgt_lang)

    @classmethod
    def of(cls, vocab, data) -> Languages:
        """The scheme of a vocabulary (data/vocab.py's) and a config's `data` section."""
        tags, codes = corpora.tag_ids(vocab), dict(vocab.languages)
        scheme: Scheme = "codes" if codes else "tags" if tags else "one"
        ids = codes or tags or {}
        targets = tuple(sorted(ids) or corpora.target_languages(data))
        return cls(scheme, ids, targets, data.src_lang, data.tgt_lang)

    @property
    def needs_target(self) -> bool:
        """Whether a translation must name its target language (a tagged model)."""
        return self.scheme == "tags"

    @property
    def codes(self) -> bool:
        """Whether the decoder reads a target-language code after its start (an NLLB model)."""
        return self.scheme == "codes"

    def refusal(self, lang: str | None) -> str:
        """Why translating into `lang` (None: unnamed) cannot be done ("" if it can)."""
        if lang is None and self.needs_target:
            return (
                f"this model translates into {', '.join(self.targets)}: name the target "
                "language (--tgt-lang, or tgt_lang in a request)"
            )
        if lang is not None and lang not in self.targets:
            return (
                f"target language {lang!r} is not one this model translates into "
                f"({', '.join(self.targets)})"
            )
        return ""

    def check(self, lang: str | None) -> None:
        why = self.refusal(lang)
        if why:
            raise MtxError(why)

    def source_prefix(self, lang: str | None) -> list[int] | None:
        """The ids a source starts with when translating into `lang`: its tag, or NLLB's
        source-language code; None: nothing."""
        if self.scheme == "codes":
            return [self._code(self.src_lang, "source")]
        if self.scheme == "tags":
            self.check(lang)
            return [self.ids[lang]]
        return None

    def start(self, lang: str | None) -> tuple[int, ...]:
        """What the decoder reads after its start token (Request.start): NLLB's target code."""
        if self.scheme != "codes":
            return ()
        return (self._code(lang or self.tgt_lang, "target"),)

    def _code(self, lang: str, side: str) -> int:
        if lang not in self.ids:
            raise MtxError(
                f"{side} language {lang!r} is not one of this model's language codes (e.g. "
                f"{', '.join(sorted(self.ids)[:3])}): set --src-lang/--tgt-lang "
                "or data.src_lang/data.tgt_lang"
            )
        return self.ids[lang]

    def any_prefix(self) -> list[int] | None:
        """A source prefix of the right length whatever the target: what the server counts
        source tokens with before it knows the target (a tag or a code is one piece)."""
        return [next(iter(self.ids.values()))] if self.ids else None
