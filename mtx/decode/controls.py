"""What a user asks of one sentence's translation, as text: its controls, read from a JSON line
(`mtx translate --json`, corpus translation) or a request to `mtx serve`, and from a glossary.

    {"text": "Der Vertrag ist gültig.", "prefix": "The", "constraints": ["agreement"],
     "avoid": ["contract"]}

- `prefix`: the output starts with it (whole words: it is segmented as the start of a
  translation would be);
- `constraints`: phrases the output must contain (hard constraints);
- `avoid`: phrases it must not contain;
- `alternatives`: N, the N most probable words after the prefix, each continued to a whole
  translation, best first (as CTranslate2's `return_alternatives`).

The Translator segments each with the target side's SentencePiece model into the ids of a
`Request` (request.py). A phrase is segmented alone, as words: SentencePiece segments each word
by itself (data/words.py says why), so a phrase of whole words has the same pieces alone as in a
sentence; a constraint is met by those pieces, in that order, anywhere in the output.

A glossary (`--glossary FILE`: one "source term TAB target term" a line; several lines may give
one source term several target terms) turns the source terms a sentence contains into
constraints. Terms are matched on words (runs of letters and digits, as Python's `\\w`),
case-insensitively, with no rule for inflection: each form to match is a line of its own. The
first target term of a source term is the one required; the term counts as honoured when any of
its target terms appears, on words and case-insensitively, in the translation. This module
imports no torch: the server's own process reads requests with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtx.errors import MtxError

FIELDS = ("text", "prefix", "constraints", "avoid", "alternatives")
WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Controls:
    """One sentence's controls, as text."""

    prefix: str = ""
    constraints: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    alternatives: int = 0

    def __bool__(self) -> bool:
        return bool(self.prefix or self.constraints or self.avoid or self.alternatives)


@dataclass(frozen=True)
class Line:
    """A source text and its controls; `terms`: the glossary's terms it contains (`Term`)."""

    text: str
    controls: Controls = Controls()
    terms: tuple[Term, ...] = ()


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


def controls_of(value: dict, where: str) -> Controls:
    """The controls of a JSON object (its prefix, constraints and avoid), each checked: `where`
    names the object in an error (e.g. "line 3")."""
    prefix = value.get("prefix", "")
    if not isinstance(prefix, str):
        raise MtxError(f"{where}: prefix must be a string")
    need, avoid = (_phrases(value, key, where) for key in ("constraints", "avoid"))
    alternatives = value.get("alternatives", 0)
    if type(alternatives) is not int or alternatives < 0:
        raise MtxError(f"{where}: alternatives must be a whole number, at least 0")
    if alternatives and need:
        raise MtxError(f"{where}: alternatives take no constraints")
    prefix = " ".join(prefix.split())
    return Controls(prefix, need, avoid, alternatives)


def _phrases(value: dict, key: str, where: str) -> tuple[str, ...]:
    """The phrases of a JSON object's `key`: a list of non-empty strings, spaces normalised."""
    items = value.get(key, [])
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise MtxError(f"{where}: {key} must be a list of strings")
    for i, item in enumerate(items):
        if not item.split():
            raise MtxError(f"{where}: {key}[{i}] is empty")
    return tuple(" ".join(x.split()) for x in items)


def parse_line(raw: str, where: str) -> Line:
    """A JSON line of `mtx translate --json`: {"text": ..., "prefix": ..., "constraints": [...],
    "avoid": [...]} (all but text optional); MtxError naming `where` if it is not one."""
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise MtxError(f"{where}: not a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise MtxError(f"{where}: not a JSON object but {type(value).__name__}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise MtxError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(FIELDS)})")
    if not isinstance(value.get("text"), str):
        raise MtxError(f"{where}: text must be a string (the source)")
    return Line(value["text"], controls_of(value, where))


def segment(
    controls: Controls, encode: Callable[[str], list[int]], never_below: int, longest: int
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """The target ids of `controls`' prefix, constraints and avoided phrases (`encode`: the
    target side's segmenter), refused in one line where they cannot be honoured: a piece the
    model never produces (an id below `never_below`: UNK), a prefix that leaves no room for EOS
    in the sentence's `longest` output, an avoided phrase within the prefix or a constraint."""

    def ids(text: str, what: str) -> tuple[int, ...]:
        out = tuple(encode(text))
        if any(i < never_below for i in out):
            raise MtxError(f"{what} holds characters the vocabulary lacks (it would be UNK)")
        return out

    prefix = ids(controls.prefix, "the prefix") if controls.prefix else ()
    need = tuple(ids(c, f"constraint {c!r}") for c in controls.constraints)
    avoid = tuple(ids(a, f"avoided phrase {a!r}") for a in controls.avoid)
    room = 2 if controls.alternatives else 1  # EOS, and an alternative before it
    if len(prefix) + room > longest:
        raise MtxError(
            f"the prefix has {len(prefix)} pieces, but this line's longest output is {longest}, "
            "EOS included (decode.max_len_a/max_len_b)"
            + (": no room for an alternative" if controls.alternatives else "")
        )
    places = [(prefix, "the prefix")]
    places += [(x, f"constraint {text!r}") for x, text in zip(need, controls.constraints)]
    for phrase, text in zip(avoid, controls.avoid):
        for x, what in places:
            if any(x[i : i + len(phrase)] == phrase for i in range(len(x) - len(phrase) + 1)):
                raise MtxError(f"{what} holds the avoided phrase {text!r}")
    return prefix, need, avoid


def fits(prefix: tuple[int, ...], constraints: tuple[tuple[int, ...], ...], longest: int) -> bool:
    """Whether a prefix, the constraints and EOS fit in a `longest` output: then every output
    contains every constraint (decode/controlled.py)."""
    return len(prefix) + sum(len(c) for c in constraints) + 1 <= longest


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

    def apply(self, line: Line) -> Line:
        """`line` with the required target term of each term it contains among its constraints."""
        terms = self.terms(line.text)
        wanted = [t.targets[0] for t in terms if t.targets[0] not in line.controls.constraints]
        c = line.controls
        controls = Controls(c.prefix, (*c.constraints, *dict.fromkeys(wanted)), c.avoid)
        return Line(line.text, controls, tuple(terms))


@dataclass
class Report:
    """A run's count of constraints and glossary terms: what `mtx translate` says at the end."""

    lines: int = 0  # lines with constraints
    constraints: int = 0
    unmet: int = 0  # constraints an output lacks (its longest output came first)
    unfit: int = 0  # lines whose prefix and constraints cannot fit in their longest output
    terms: int = 0  # glossary terms found
    honoured: int = 0

    def add(self, line: Line, translation: str, unmet: int) -> None:
        if line.controls.constraints:
            self.lines += 1
            self.constraints += len(line.controls.constraints)
            self.unmet += unmet
        self.terms += len(line.terms)
        self.honoured += sum(t.honoured(translation) for t in line.terms)

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
