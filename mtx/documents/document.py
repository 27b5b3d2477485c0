"""One input text in a format (`FORMATS`): the sentences to translate, and the text made of
their translations.

    doc = Document.read(text, settings)
    translations = translate(doc.sentences)          # (text, word links) of each
    doc.assemble(translations)                       # the translated text

- plain: the text is one sentence, translated as it is (what mtx always did).
- paragraphs: the text is a paragraph: split into sentences (sentences.py), each translated,
  joined with the source's spacing; placeholders kept.
- html, xml: each block element's text is a paragraph (markup.py); inline elements and
  placeholders are put back by the word alignment (project.py).

`Settings.of(decode config, source language)` reads the decode.* settings of documents once.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from mtx.documents import FORMATS
from mtx.documents.atoms import Atom, Kind
from mtx.documents.markup import NOT_XML, Tree, Unreadable, parse
from mtx.documents.placeholders import compile_patterns
from mtx.documents.project import project
from mtx.documents.unit import Sentence, Unit
from mtx.errors import MtxError


@dataclass(frozen=True)
class Settings:
    """How documents are read: the format, the source language (sentence splitting), the
    placeholders' pattern, and which tags are inline and which kept untranslated."""

    format: str = "plain"  # one of FORMATS
    lang: str = "en"
    pattern: re.Pattern | None = None
    inline_tags: frozenset[str] = frozenset()
    keep_tags: frozenset[str] = frozenset()
    split: bool = True  # a block's sentences translated one by one (False: a block is one)

    @property
    def plain(self) -> bool:
        """A line is one sentence, as it is."""
        return self.format == FORMATS[0]

    @property
    def markup(self) -> bool:
        """A line is markup (html or xml), parsed (markup.py)."""
        return self.format in FORMATS[2:]

    @classmethod
    def of(cls, d, lang: str | None, fmt: str | None = None) -> Settings:
        """From a DecodeConfig (decode.placeholders, inline_tags, keep_tags) and the format
        `fmt` (None: decode.format)."""
        fmt = d.format if fmt is None else fmt
        if fmt not in FORMATS:
            raise MtxError(f"decode.format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        return cls(
            fmt,
            lang or "en",
            compile_patterns(d.placeholders),
            frozenset(t.lower() for t in d.inline_tags),
            frozenset(t.lower() for t in d.keep_tags),
        )


class Document:
    """A text's units, their sentences (what to translate), and how to write it back."""

    def __init__(self, text: str, units: list[Unit], tree: Tree | None, settings: Settings):
        self.source, self.units, self.tree, self.settings = text, units, tree, settings
        self.parts: list[tuple[int, Sentence]] = []  # (unit, sentence) of each to translate
        split = settings.split and not settings.plain
        for u, unit in enumerate(units):
            if unit.has_words():
                self.parts += [(u, s) for s in unit.sentences(settings.lang, split)]
        self.repairs = tree.repairs if tree is not None else []
        self.escape = False  # markup read as text: written back escaped

    @classmethod
    def read(cls, text: str, settings: Settings) -> Document:
        """`text` in its format; markup the parser cannot read even with its repairs is
        translated as text (escaped when written back), which is said in `repairs`."""
        if settings.markup:
            try:
                tree = parse(text, settings.format, settings)
            except Unreadable as e:
                unit = Unit(settings.pattern)
                unit.add_text(NOT_XML.sub(" ", text))
                doc = cls(text, [unit], None, settings)
                doc.escape, doc.repairs = True, [f"{e}: translated as text"]
                return doc
            return cls(text, [u for u, _ in tree.units], tree, settings)
        unit = Unit(None if settings.plain else settings.pattern)
        unit.add_text(text)
        return cls(text, [unit], None, settings)

    @property
    def sentences(self) -> list[str]:
        """What the model translates, in order (a sentence with no words is not here)."""
        return [s.text for _, s in self.parts if s.words]

    def needs_links(self) -> list[bool]:
        """Whether each of `sentences` has marks to put back (then its word links are read)."""
        return [bool(s.marks) for _, s in self.parts if s.words]

    def assemble(self, translations: list[tuple[str, object]]) -> str:
        """The text with each sentence replaced by its translation: (text, word links or
        None) of each of `sentences`, in order."""
        if self.settings.plain:
            return translations[0][0] if translations else self.source
        done = iter(translations)
        per_unit: dict[int, list] = {}
        for u, sentence in self.parts:
            target, links = next(done) if sentence.words else ("", ())
            unit = self.units[u]
            atoms = _lead(sentence, unit, project(sentence, unit.marks, target, links))
            atoms += [Atom.word(sentence.trail)] if sentence.trail else []
            per_unit.setdefault(u, []).extend(atoms)
        if self.tree is None:
            text = _text(per_unit.get(0, []), self.units[0]) if per_unit else self.source
            return html.escape(text, quote=False) if self.escape else text
        for (unit, slot), u in zip(self.tree.units, range(len(self.units))):
            if u in per_unit:
                self.tree.write(slot, unit, per_unit[u])
        return self.tree.serialise()


def _lead(sentence: Sentence, unit: Unit, atoms: list[Atom]) -> list[Atom]:
    """The sentence's lead (the space before its first word) and its atoms. A kept mark that
    stood before that space (`<code>x</code> the dog`) had the space after it: written first,
    the space follows it, as it did; placed among the words, it brings its own spacing and
    the lead is not written (either way the line does not begin with a space)."""
    lead = [Atom.word(sentence.lead)] if sentence.lead else []
    if not lead or sentence.lead.strip() or not sentence.words:
        return lead + atoms
    before = sentence.words[0][0] - len(sentence.lead)  # where the lead began
    kept = [a for a in atoms if a.kind is Kind.KEEP and unit.marks[a.value].start <= before]
    if not kept:
        return lead + atoms
    if atoms[0] is not kept[0]:
        return atoms
    rest = atoms[1:]
    return [atoms[0], *lead, *(rest[1:] if rest and rest[0].kind is Kind.SPACE else rest)]


def _text(atoms: list[Atom], unit: Unit) -> str:
    out = []
    for atom in atoms:
        if atom.kind.text:
            out.append(atom.value)
        elif atom.kind is Kind.KEEP:
            out.append(unit.marks[atom.value].payload)
    return "".join(out)
