"""What a translated sentence is made of once its marks are put back (project.py): a list of
`Atom`s, each a word, a space, a span's opening or closing, or a kept mark. document.py writes
them as text, markup.py as elements; nothing else names a kind."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    WORD = "word"  # text of the translation (or a sentence's lead and trail)
    SPACE = "space"  # one space between two atoms that both allow one
    OPEN = "open"  # a span's opening tag (its mark's key)
    CLOSE = "close"  # its closing tag
    KEEP = "keep"  # a kept mark: a placeholder, an element written back as it was

    @property
    def text(self) -> bool:
        """Whether an atom of this kind is text (a word or a space), not a mark."""
        return self in (Kind.WORD, Kind.SPACE)


@dataclass(frozen=True)
class Atom:
    kind: Kind
    value: str | int  # a word's or a space's text; a mark's key (unit.py's Unit.marks)
    # while being placed (project.py): whether a space may come before it, and after it
    space_before: bool = False
    space_after: bool = False

    @classmethod
    def word(cls, text: str, before: bool = True, after: bool = True) -> Atom:
        return cls(Kind.WORD, text, before, after)


SPACE = Atom(Kind.SPACE, " ")
