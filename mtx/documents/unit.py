"""A unit (a paragraph, a block element's text) as plain text with marks on it, and its
sentences as the model reads them.

A *mark* is an inline element around part of the text (a span: `<b>`, `<a href>`) or a piece
kept whole at one place (a *kept* mark: a placeholder, `<br>`, `<img>`, an element not to
translate, a comment). The text holds no mark: a placeholder's characters are taken out (with
the whitespace it leaves doubled), an element's tags are not text.

A sentence lists its words (whitespace-separated, as the model's alignments count them) and
where each of its marks sits among them: a span covers the words it overlaps (a tag inside a
word takes the whole word), a kept mark is before or after a word, or inside one (`fahr<br>e`,
`{name},`). A line break (`<br>`) ends a sentence; sentences never cut a span: sentences a span
crosses are one sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mtx.documents.sentences import split

WORD = re.compile(r"\S+")


@dataclass
class Mark:
    """A span (`end` set when it closes) or a kept mark (`end` None) of a unit."""

    payload: Any  # the element (markup.py) or a placeholder's text
    start: int  # its place in the unit's text
    end: int | None = None
    parent: int | None = None  # the span that holds it
    # a kept mark: no whitespace between it and the text before / after it in the source
    glue: tuple[bool, bool] | None = None
    span: bool = False
    left: bool = False  # no whitespace before it when it was read


@dataclass
class Sentence:
    """A sentence of a unit: `words` ([start, end) in the unit's text), the whitespace around
    them (`lead`, `trail`: kept as they are), and where its marks sit (`spans`: key -> first
    word, end word; `kept`: key -> anchor, ("before" | "after", word) or ("inside", word,
    characters into it))."""

    words: list[tuple[int, int]]
    strings: list[str]
    lead: str
    trail: str
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    kept: dict[int, tuple] = field(default_factory=dict)
    # a span that begins (ends) inside a word at punctuation: the punctuation outside it
    # (`"<b>word</b>".`: '"' and '".'), put outside it again in the translation
    cuts: dict[int, tuple[str, str]] = field(default_factory=dict)
    marks: list[int] = field(default_factory=list)  # every mark of the sentence, in order

    @property
    def text(self) -> str:
        """What the model translates: the words, one space apart."""
        return " ".join(self.strings)


class Unit:
    """Text with marks, built in reading order: `add_text`, `open`/`close`, `keep`."""

    def __init__(self, placeholders: re.Pattern | None = None) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.marks: list[Mark] = []
        self.stack: list[int] = []
        self.placeholders = placeholders
        self.breaks: list[int] = []  # where a line break (<br>) ends a sentence
        self.ends_with_placeholder = False  # a placeholder after whitespace, nothing after it

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _append(self, s: str) -> None:
        self.parts.append(s)
        self.length += len(s)
        self.ends_with_placeholder &= not s

    def _last_char(self) -> str:
        for part in reversed(self.parts):
            if part:
                return part[-1]
        return ""

    def add_text(self, s: str) -> None:
        """Text, its placeholders taken out as kept marks."""
        if self.placeholders is None:
            return self._append(s)
        position = 0
        for m in self.placeholders.finditer(s):
            before = s[position : m.start()]
            self._append(before)
            space_before = (before[-1:] or self._last_char() or " ").isspace()
            after = s[m.end() : m.end() + 1]
            space_after = (after or " ").isspace()
            position = m.end()
            if space_before and space_after and after:  # "a %d b" reads "a b"
                position = len(s) - len(s[position:].lstrip())
            elif space_before and after and not space_after:  # "Hi {name}, x" reads "Hi, x"
                self._strip_trailing_space()
            # glued after it: known from this text, else from what follows (`sentences`)
            self.keep(m.group(), glue=(not space_before, not space_after) if after else None)
            if not after:
                self.marks[-1].left = not space_before
            # at the end of this text: what follows decides (an element, more text, the end)
            self.ends_with_placeholder = space_before and not after
        self._append(s[position:])

    def _strip_trailing_space(self) -> None:
        """The whitespace at the end of the text so far taken out (marks in it move back)."""
        while self.parts and (not self.parts[-1] or self.parts[-1][-1].isspace()):
            stripped = self.parts[-1].rstrip()
            self.length -= len(self.parts[-1]) - len(stripped)
            self.parts[-1] = stripped
            if stripped:
                break
            self.parts.pop()
        for m in self.marks:
            m.start = min(m.start, self.length)
            if m.end is not None:
                m.end = min(m.end, self.length)

    def open(self, payload: Any) -> None:
        self.ends_with_placeholder = False
        parent = self.stack[-1] if self.stack else None
        left = not (self._last_char() or " ").isspace()
        self.marks.append(Mark(payload, self.length, parent=parent, span=True, left=left))
        self.stack.append(len(self.marks) - 1)

    def close(self) -> None:
        self.marks[self.stack.pop()].end = self.length

    def line_break(self, payload: Any) -> None:
        """A kept mark that also ends the sentence before it (`<br>`)."""
        self.breaks.append(self.length)
        self.keep(payload)

    def keep(self, payload: Any, glue: tuple[bool, bool] | None = None) -> None:
        parent = self.stack[-1] if self.stack else None
        left = not (self._last_char() or " ").isspace()
        self.marks.append(Mark(payload, self.length, parent=parent, glue=glue, left=left))

    def has_words(self) -> bool:
        return bool(self.text.split())

    def sentences(self, lang: str, split_sentences: bool = True) -> list[Sentence]:
        """The unit's sentences (one, unless `split_sentences`), every mark in one of them."""
        if self.ends_with_placeholder:  # "a %d" at the end reads "a"
            self._strip_trailing_space()
        text = self.text
        for m in self.marks:
            end = m.start if m.end is None else m.end
            if m.glue is None:
                m.glue = (m.left, end < len(text) and not text[end].isspace())
        ranges = split(text, lang) if split_sentences else [(0, len(text))]
        if split_sentences:
            ranges = _cut(ranges, self.breaks)
        ranges = self._joined(ranges) or [(0, len(text))]
        out = [self._sentence(text, s, e, self.breaks) for s, e in ranges]
        for key, m in enumerate(self.marks):
            i = next((k for k, (s, e) in enumerate(ranges) if s <= m.start < e), len(ranges) - 1)
            if m.parent is not None:  # a mark stays in its span's sentence
                i = next(k for k, sentence in enumerate(out) if m.parent in sentence.marks)
            self._place(out[i], key, m)
        return out

    def _joined(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`ranges` with those a span crosses made one."""
        out: list[tuple[int, int]] = []
        for s, e in ranges:
            if out and any(m.span and m.start < s < (m.end or 0) for m in self.marks):
                out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out

    @staticmethod
    def _sentence(text: str, s: int, e: int, breaks: list[int]) -> Sentence:
        found = [(m.start(), m.end()) for m in WORD.finditer(text, s, e)]
        found = [w for a, b in found for w in _cut([(a, b)], breaks)]  # a break parts words
        lead = text[s : found[0][0]] if found else text[s:e]
        trail = text[found[-1][1] : e] if found else ""
        return Sentence(found, [text[a:b] for a, b in found], lead, trail)

    def _place(self, sentence: Sentence, key: int, m: Mark) -> None:
        sentence.marks.append(key)
        words = sentence.words
        if m.span:
            inside = [i for i, (a, b) in enumerate(words) if b > m.start and a < (m.end or 0)]
            if inside:
                a, b = inside[0], inside[-1] + 1
                sentence.spans[key] = (a, b)
                before = self.text[words[a][0] : m.start] if words[a][0] < m.start else ""
                after = self.text[m.end : words[b - 1][1]] if (m.end or 0) < words[b - 1][1] else ""
                cut = tuple("" if any(c.isalnum() for c in x) else x for x in (before, after))
                if any(cut):
                    sentence.cuts[key] = cut
                return
        sentence.kept[key] = anchor(words, m.start, m.glue or (False, False))


def _cut(ranges: list[tuple[int, int]], at: list[int]) -> list[tuple[int, int]]:
    """`ranges` cut at each of the positions `at` inside one."""
    out = []
    for s, e in ranges:
        for p in sorted(set(x for x in at if s < x < e)):
            out.append((s, p))
            s = p
        out.append((s, e))
    return out


def anchor(words: list[tuple[int, int]], p: int, glue: tuple[bool, bool]) -> tuple:
    """Where a kept mark at character `p` sits among `words`: ("before", i), ("after", i),
    ("inside", i, offset) or ("at", 0) in a sentence without words."""
    if not words:
        return ("at", 0)
    i = next((k for k, (a, b) in enumerate(words) if b > p), None)
    if i is None:
        return ("after", len(words) - 1)
    a, _ = words[i]
    if a < p:
        return ("inside", i, p - a)
    if glue[0] and i > 0 and words[i - 1][1] == p and not glue[1]:
        return ("after", i - 1)
    return ("before", i)
