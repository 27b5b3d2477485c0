"""How a setting is declared (`setting`: its default, description and range) and how every
field is checked against its declaration (`check_fields`): the part of the settings
engine that the sections use."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from mtx.errors import MtxError


@dataclass(frozen=True)
class Range:
    """The numbers a field accepts: from `low` to `high` (either may be open-ended: None),
    each bound included unless its `*_open` flag says otherwise. NaN and infinities never are."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and not (
            value > self.low or (value == self.low and not self.low_open)
        ):
            return False
        return self.high is None or value < self.high or (value == self.high and not self.high_open)

    def describe(self, integer: bool) -> str:
        """The range in words, as the error says it: 'positive', '0 or more', 'in [0, 1)'."""
        low, high = self.low, self.high
        if high is None:
            if low == 0:
                return "positive" if self.low_open else "0 or more"
            return f"at least {low:g}"
        if integer and not (self.low_open or self.high_open):
            return f"in {low:g}..{high:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{low:g}, {high:g}{right}"


POSITIVE = Range(0, low_open=True)
NOT_NEGATIVE = Range(0)
AT_LEAST_1 = Range(1)
FRACTION = Range(0, 1, high_open=True)  # dropout, label smoothing, Adam's betas
LAYER = Range(-256, 255)  # a layer of a stack, from 0 (negative: from the last)


def setting(default: Any, doc: str, range: Range | None = None, neutral: bool = False) -> Any:
    """A config field: its default, a one-line description and, for a number, its range;
    `neutral`: it changes how fast an output comes, never the output (a corpus job does not
    record it: jobs/corpus.py)."""
    metadata = {"doc": doc, "range": range, "neutral": neutral}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# --- checking fields against their declarations -------------------------------------------


def literal_words(tp: Any) -> tuple[str, ...] | None:
    """The words a Literal type allows (None for other types)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def words(allowed: tuple[str, ...]) -> str:
    if len(allowed) > 4:
        return "one of " + ", ".join(allowed)
    return ", ".join(allowed[:-1]) + " or " + allowed[-1]


def check_fields(settings: Any, prefix: str) -> None:
    """MtxError naming the first field of `settings` whose value is outside its declared
    choices or range."""
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        if "section" in f.metadata:  # a section inside a section: data.clean
            check_fields(getattr(settings, f.name), f"{prefix}{f.name}.")
        if "doc" not in f.metadata:
            continue
        key, value, tp = prefix + f.name, getattr(settings, f.name), hints[f.name]
        choices = literal_words(tp)
        if choices is not None and value not in choices:
            raise MtxError(f"{key} must be {words(choices)}, got {value!r}")
        item_type = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        item_choices = literal_words(item_type) if item_type is not None else None
        for item in value if item_choices else ():
            if item not in item_choices:
                raise MtxError(f"{key}: {item!r} is not one of {', '.join(item_choices)}")
        for i, item in enumerate(value if dataclasses.is_dataclass(item_type) else ()):
            check_fields(item, f"{key}[{i}].")
        valid = f.metadata["range"]
        if valid is not None and value not in valid:
            raise MtxError(f"{key} must be {valid.describe(tp is int)}, got {value}")
