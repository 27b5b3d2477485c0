"""What one sentence asks of a search (`Request`), and a batch of them as a search reads it
(`SearchBatch`).

Every entry point (`mtx translate` and corpus translation through the Translator, the server's
engine, distillation) turns each input line into a `Request`; batches.py is the one place that
sorts requests into batches and pads their sources into a `SearchBatch`; every search reads
each row's request from it. A sentence's output depends on its own request alone: nothing in a
request is read across rows.

A request holds the source as the model reads it, its line number (the seed of its samples),
if it has one, its own length limit, its controls (controls.py: a target prefix, constraints, phrases to
avoid, alternatives), segmented into target ids, and what the decoder reads after its start
token before the output (an NLLB model's target-language code). A control a caller may add per
sentence is declared in controls.py, not here: it travels in `controls`, and engines.py says
which engine takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtx.decode import rules
from mtx.decode.controls import Segmented
from mtx.model.groups import Groups
from mtx.tokens import PAD_ID


@dataclass(frozen=True)
class Request:
    """One sentence to translate."""

    source: tuple[int, ...]  # source ids as the model reads them: its tag first, EOS last
    line: int = 0  # its line number in the input: the seed of its samples
    max_len: int | None = None  # its longest output, EOS included; None: decode.max_len_a/b's
    controls: Segmented = Segmented()  # its controls as target ids (controls.py)
    # read by the decoder after its start token, given, not produced nor scored (an NLLB
    # model's target-language code): not part of the output
    start: tuple[int, ...] = ()

    def longest(self, a: float, b: int, limit: int) -> int:
        """Its longest output, EOS included: its own `max_len`, else a * source tokens (EOS
        excluded) + b (rules.max_lengths); never over `limit`, the model's."""
        if self.max_len is not None:
            return max(1, min(self.max_len, limit))
        return rules.max_lengths(len(self.source) - 1, a, b, limit)


@dataclass
class SearchBatch:
    """A batch as a search reads it: the padded sources (B, S) or a `Groups` of several padded
    lengths (model/groups.py), and the request of each row, in order."""

    src: Tensor | Groups
    requests: list[Request]

    def __post_init__(self) -> None:
        if len(self.requests) != self.src.size(0):
            raise ValueError(f"{len(self.requests)} requests for {self.src.size(0)} rows")

    @classmethod
    def of(cls, src: Tensor | Groups | SearchBatch, lines: list[int] | None = None) -> SearchBatch:
        """A batch of padded sources with nothing asked of them but their line numbers
        (`lines`, else 0, 1, ...): what tests and benchmarks decode."""
        if isinstance(src, SearchBatch):
            return src
        parts = src.parts if isinstance(src, Groups) else [src]
        rows = [
            tuple(row[:n])  # padding trails the source (data/batching.py's pad)
            for part in parts
            for row, n in zip(part.tolist(), (part != PAD_ID).sum(1).tolist())
        ]
        lines = list(range(len(rows))) if lines is None else lines
        return cls(src, [Request(ids, line) for ids, line in zip(rows, lines, strict=True)])

    def subset(self, rows: list[int]) -> SearchBatch:
        """The batch of the rows `rows` (ascending) alone, each computed as in this one."""
        index = torch.tensor(rows, device=self.src.device)
        return SearchBatch(self.src[index], [self.requests[i] for i in rows])

    def starts(self, start: int) -> Tensor:
        """(B, 1 + n) what each row's decoder reads before its output: the model's `start`
        token, then its request's `start` ids (n of them, the same n in every row)."""
        widths = {len(r.start) for r in self.requests}
        if len(widths) > 1:
            raise ValueError(f"requests with {sorted(widths)} start ids in one batch")
        rows = [(start, *r.start) for r in self.requests]
        return torch.tensor(rows, dtype=torch.long, device=self.src.device)

    def max_lengths(self, a: float, b: int, limit: int) -> list[int]:
        """Each row's longest output, EOS included (`Request.longest`)."""
        return [r.longest(a, b, limit) for r in self.requests]

    @property
    def lines(self) -> list[int]:
        return [r.line for r in self.requests]
