"""Progress of a long job on stderr: a tqdm bar on a terminal; elsewhere (stderr redirected
to a file, a CI log, a batch system) one plain line every `every` seconds and one at the end,
as fairseq's log interval does, so that a log says how far a job got and not carriage
returns.

    with Progress(total, "translated", "lines", initial=done) as progress:
        progress.update(n)
"""

from __future__ import annotations

import sys
import time
from typing import IO

from tqdm import tqdm

EVERY_S = 30.0  # seconds between two plain lines


class Progress:
    def __init__(
        self,
        total: int,
        verb: str,
        unit: str,
        initial: int = 0,
        every: float = EVERY_S,
        file: IO[str] | None = None,
        clock=time.monotonic,
    ) -> None:
        self.file = file or sys.stderr
        self.total, self.verb, self.unit, self.every, self.clock = total, verb, unit, every, clock
        self.done = self.start_done = initial
        self.bar = None
        if _is_terminal(self.file):
            self.bar = tqdm(total=total, initial=initial, unit=f" {unit}", file=self.file)
        self.started = self.last = clock()

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.clock() - self.last >= self.every:
            self.line()

    def line(self) -> None:
        """One plain line: how many of how many, the rate, the time left."""
        now = self.clock()
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self.start_done) / elapsed
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        left = (self.total - self.done) / rate if rate > 0 and self.total else None
        eta = f", {left:.0f} s left" if left is not None and self.done < self.total else ""
        print(
            f"{self.verb} {self.done:,}/{self.total:,} {self.unit}{share}, "
            f"{rate:,.1f} {self.unit}/s{eta}",
            file=self.file,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.done > self.start_done:
            self.line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False
