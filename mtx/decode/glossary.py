"""A glossary: source terms and the target terms a translation of them must use, turned into
constraints (controls.py) of the lines that contain them, and the count of what was honoured.

A glossary (`--glossary FILE`: one "source term TAB target term" a line; several lines may give
one source term several target terms) turns the source terms a sentence contains into
constraints. Terms are matched on words (runs of letters and digits, as Python's `\\w`),
case-insensitively, with no rule for inflection: each form to match is a line of its own. The
first target term of a source term is the one required; the term counts as honoured when any of
its target terms appears, on words and case-insensitively, in the translation. A line that asks
for alternatives takes no constraints (engines.py): where a term is found in one, it is refused
in one line naming the line. This module imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mtx.decode.controls import Line
from mtx.errors import MtxError

WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Term:
    source: str  # as the glossary writes it
    targets: tuple[str, ...]  # the first is required

    def honoured(self, translation: str) -> bool:
        return any(contains(translation, t) for t in self.targets)


def words(text: str) -> list[str]:
    return WORD.findall(text.casefold())


def contains(text: str, phrase: str) -> bool:
    """Whether `text` holds the words of `phrase`, in order and consecutive (ignoring case)."""
    have, want = words(text), words(phrase)
    n = len(want)
    return n > 0 and any(have[i : i + n] == want for i in range(len(have) - n + 1))


@dataclass
class Glossary:
    """Source terms (as word tuples, lowercased) and their target terms."""

    entries: dict[tuple[str, ...], Term] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Glossary:
        if not path.is_file():
            raise MtxError(f"glossary not found: {path}")
        entries: dict[tuple[str, ...], Term] = {}
        text = path.read_text(encoding="utf-8")
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip() or raw.startswith("#"):
                continue
            parts = raw.split("\t")
            if len(parts) != 2:
                why = "no tab" if len(parts) == 1 else "more than one tab"
                raise MtxError(f"{path} line {number}: {why} (SOURCE TERM<TAB>TARGET TERM)")
            source, target = (" ".join(p.split()) for p in parts)
            if not words(source) or not words(target):
                raise MtxError(f"{path} line {number}: an empty term")
            key = tuple(words(source))
            term = entries.get(key)
            targets = (*term.targets, target) if term else (target,)
            entries[key] = Term(term.source if term else source, targets)
        if not entries:
            raise MtxError(f"{path}: no terms")
        return cls(entries)

    def terms(self, text: str) -> list[Term]:
        """The terms whose source words `text` contains, in order of first appearance."""
        have, found = words(text), {}
        longest = max(len(k) for k in self.entries)
        for i in range(len(have)):
            for n in range(1, min(longest, len(have) - i) + 1):
                term = self.entries.get(tuple(have[i : i + n]))
                if term is not None:
                    found.setdefault(term.source, term)
        return list(found.values())

    def apply(self, line: Line, where: str) -> Line:
        """`line` with the required target term of each term it contains among its
        constraints; refused naming `where` when the line asks for alternatives (which take no
        constraints) and holds a term."""
        terms = self.terms(line.text)
        if not terms:
            return line
        c = line.controls
        if c.alternatives:
            raise MtxError(
                f"{where}: alternatives take no constraints, and the glossary's term "
                f"{terms[0].source!r} would be one (leave out alternatives or the glossary)"
            )
        wanted = [t.targets[0] for t in terms if t.targets[0] not in c.constraints]
        constraints = (*c.constraints, *dict.fromkeys(wanted))
        return Line(line.text, c.replace(constraints=constraints), tuple(terms))


@dataclass
class Report:
    """A run's count of constraints and glossary terms: what `mtx translate` says at the end."""

    lines: int = 0  # lines with constraints
    constraints: int = 0
    unmet: int = 0  # constraints an output lacks (its longest output came first)
    unfit: int = 0  # lines whose prefix and constraints cannot fit in their longest output
    terms: int = 0  # glossary terms found
    honoured: int = 0

    def count(self, line: Line, translation: str, unmet: int) -> None:
        """Count a line with controls or glossary terms, and its translation."""
        if line.controls.constraints:
            self.lines += 1
            self.constraints += len(line.controls.constraints)
            self.unmet += unmet
        self.terms += len(line.terms)
        self.honoured += sum(t.honoured(translation) for t in line.terms)

    def merge(self, other: Report) -> None:
        """Add another process's counts (a torchrun job's: jobs/shards.py)."""
        self.lines += other.lines
        self.constraints += other.constraints
        self.unmet += other.unmet
        self.unfit += other.unfit
        self.terms += other.terms
        self.honoured += other.honoured

    def summary(self) -> str:
        parts = []
        if self.lines:
            met = self.constraints - self.unmet
            parts.append(
                f"constraints: {met:,} of {self.constraints:,} met in {self.lines:,} lines"
            )
            if self.unfit:
                parts.append(f"{self.unfit:,} lines could not fit theirs in their longest output")
        if self.terms:
            share = 100 * self.honoured / self.terms
            parts.append(
                f"glossary: {self.honoured:,} of {self.terms:,} terms honoured ({share:.1f}%)"
            )
        return "; ".join(parts)
