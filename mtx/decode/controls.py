"""What a user may ask of one sentence's translation besides its text: its controls, declared
once here (`CONTROLS`), and read from a JSON line (`mtx translate --json`, corpus translation),
a request to `mtx serve` (its request model is made from these declarations: serve/app.py) and
a glossary's merge (glossary.py).

    {"text": "Der Vertrag ist gültig.", "prefix": "The", "constraints": ["agreement"],
     "avoid": ["contract"]}

- `prefix`: the output starts with it (whole words: it is segmented as the start of a
  translation would be);
- `constraints`: phrases the output must contain (hard constraints);
- `avoid`: phrases it must not contain;
- `alternatives`: N, the N most probable words after the prefix, each continued to a whole
  translation, best first (as CTranslate2's `return_alternatives`).

A control is one of three kinds, each with its JSON type, default, check and segmentation:
`text` (a string: whitespace normalised; segmented into target ids), `phrases` (a list of
non-empty strings; each segmented alone into target ids) and `count` (a whole number, at least
0; kept as it is). `Controls` holds the ones a sentence sets, by name, as text (a `Line`'s)
or segmented (a `Request`'s: decode/request.py); a sentence has controls when it sets one.

Which engine decodes a sentence, and which controls each engine takes, is engines.py's: a
control the chosen engine does not take is refused in one line there. Adding a control is
adding a `Control` here and to the `takes` of the engines that honour it (engines.py), and
reading it in them (tests/helpers/madeup.py declares one, and an engine that takes it).

A phrase is segmented alone, as words: SentencePiece segments each word by itself
(data/words.py says why), so a phrase of whole words has the same pieces alone as in a
sentence; a constraint is met by those pieces, in that order, anywhere in the output. This
module imports no torch: the server's own process reads requests with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mtx.errors import MtxError

KINDS = ("text", "phrases", "count")


@dataclass(frozen=True)
class Control:
    """One control: its name (the JSON key), kind (one of KINDS) and what it asks."""

    name: str
    kind: str
    doc: str
    # a document's (decode/documents.py): it applies to each of its sentences; else it is one
    # sentence's, refused for a text of several
    each_sentence: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"control {self.name}: kind {self.kind!r} is not one of {KINDS}")

    @property
    def default(self) -> Any:
        return {"text": "", "phrases": (), "count": 0}[self.kind]

    @property
    def segmented_default(self) -> Any:
        """Its default as target ids (`segment`'s form)."""
        return () if self.kind == "text" else self.default

    @property
    def annotation(self) -> type:
        """Its JSON type, as a request model declares it (serve/app.py)."""
        return {"text": str, "phrases": list[str], "count": int}[self.kind]

    def read(self, value: Any, where: str) -> Any:
        """`value` from JSON, checked and normalised (spaces), or MtxError naming `where`."""
        name = self.name
        if self.kind == "text":
            if not isinstance(value, str):
                raise MtxError(f"{where}: {name} must be a string")
            return " ".join(value.split())
        if self.kind == "count":
            if type(value) is not int or value < 0:
                raise MtxError(f"{where}: {name} must be a whole number, at least 0")
            return value
        if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
            raise MtxError(f"{where}: {name} must be a list of strings")
        for i, item in enumerate(value):
            if not item.split():
                raise MtxError(f"{where}: {name}[{i}] is empty")
        return tuple(" ".join(x.split()) for x in value)

    def segment(self, value: Any, ids: Callable[[str, str], tuple[int, ...]]) -> Any:
        """`value` (as `read` gives it) as target ids: `ids(text, what)` segments one text."""
        if self.kind == "text":
            return ids(value, f"the {self.name}")
        if self.kind == "phrases":
            what = {"constraints": "constraint", "avoid": "avoided phrase"}.get(
                self.name, self.name
            )
            return tuple(ids(x, f"{what} {x!r}") for x in value)
        return value


CONTROLS: dict[str, Control] = {
    c.name: c
    for c in (
        Control("prefix", "text", "the output starts with it"),
        Control("constraints", "phrases", "phrases the output must contain"),
        Control("avoid", "phrases", "phrases the output must not contain", each_sentence=True),
        Control(
            "alternatives", "count", "this many alternatives at the first word after the prefix"
        ),
    )
}


class Controls(Mapping):
    """The controls a sentence sets, by name (those left at their default are not held): as
    text, or segmented into target ids. `controls.prefix` reads one (its default if unset);
    a sentence has controls when `bool(controls)`."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None, **named: Any) -> None:
        values = {**(values or {}), **named}
        for name in values:
            if name not in CONTROLS:
                raise TypeError(f"no control named {name!r} (controls: {', '.join(CONTROLS)})")
        kept = {k: v for k, v in values.items() if v != self._default(CONTROLS[k])}
        object.__setattr__(self, "_values", kept)

    @staticmethod
    def _default(control: Control) -> Any:
        return control.default

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in CONTROLS:
            raise AttributeError(name)
        return self._values.get(name, self._default(CONTROLS[name]))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Controls are frozen: use replace()")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __repr__(self) -> str:
        named = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"{type(self).__name__}({named})"

    def __reduce__(self):
        return (type(self), (dict(self._values),))

    def replace(self, **changes: Any) -> Controls:
        """These controls with `changes` (a name set to its default is unset)."""
        return type(self)({**self._values, **changes})

    @classmethod
    def read(cls, value: Mapping[str, Any], where: str) -> Controls:
        """The controls of a JSON object (other keys ignored), each checked (`Control.read`),
        MtxError naming `where` (e.g. "line 3")."""
        return cls({k: c.read(value[k], where) for k, c in CONTROLS.items() if k in value})


class Segmented(Controls):
    """Controls as target ids (`segment`): a text's default is no ids, ()."""

    __slots__ = ()

    @staticmethod
    def _default(control: Control) -> Any:
        return control.segmented_default


@dataclass(frozen=True)
class Line:
    """A source text and its controls (as text); `terms`: the glossary's terms it contains
    (glossary.py's `Term`)."""

    text: str
    controls: Controls = Controls()
    terms: tuple = ()


def fields() -> tuple[str, ...]:
    """The keys of a JSON line: the text, then each control."""
    return ("text", *CONTROLS)


def parse_line(raw: str, where: str) -> Line:
    """A JSON line of `mtx translate --json`: {"text": ..., and any of the controls} (all but
    text optional); MtxError naming `where` if it is not one."""
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise MtxError(f"{where}: not a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise MtxError(f"{where}: not a JSON object but {type(value).__name__}")
    unknown = sorted(set(value) - set(fields()))
    if unknown:
        raise MtxError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(fields())})")
    if not isinstance(value.get("text"), str):
        raise MtxError(f"{where}: text must be a string (the source)")
    return Line(value["text"], Controls.read(value, where))


def segment(
    controls: Controls, encode: Callable[[str], list[int]], never_below: int, longest: int
) -> Segmented:
    """`controls` as target ids (`encode`: the target side's segmenter), refused in one line
    where they cannot be honoured: a piece the model never produces (an id below
    `never_below`: UNK), a prefix that leaves no room for EOS in the sentence's `longest`
    output, an avoided phrase within the prefix or a constraint."""

    def ids(text: str, what: str) -> tuple[int, ...]:
        out = tuple(encode(text))
        if any(i < never_below for i in out):
            raise MtxError(f"{what} holds characters the vocabulary lacks (it would be UNK)")
        return out

    out = Segmented({k: CONTROLS[k].segment(v, ids) for k, v in controls.items()})
    prefix = out.prefix
    room = 2 if controls.alternatives else 1  # EOS, and an alternative before it
    if len(prefix) + room > longest:
        raise MtxError(
            f"the prefix has {len(prefix)} pieces, but this line's longest output is {longest}, "
            "EOS included (decode.max_len_a/max_len_b)"
            + (": no room for an alternative" if controls.alternatives else "")
        )
    places = [(prefix, "the prefix")]
    places += [(x, f"constraint {t!r}") for x, t in zip(out.constraints, controls.constraints)]
    for phrase, text in zip(out.avoid, controls.avoid):
        for x, what in places:
            if any(x[i : i + len(phrase)] == phrase for i in range(len(x) - len(phrase) + 1)):
                raise MtxError(f"{what} holds the avoided phrase {text!r}")
    return out


def fits(controls: Segmented, longest: int) -> bool:
    """Whether segmented controls' prefix, constraints and EOS fit in a `longest` output: then
    every output contains every constraint (decode/controlled.py)."""
    return needed(controls) <= longest


def needed(controls: Segmented) -> int:
    """The pieces segmented controls' prefix, constraints and EOS take."""
    return len(controls.prefix) + sum(len(c) for c in controls.constraints) + 1
