"""The faults a run survives: stop signals, batches that run out of memory, non-finite updates.

- SIGTERM and SIGINT (`StopSignals`) only set a flag; the loop saves a resumable checkpoint at
  the next step boundary and ends the run cleanly (exit 0). A second signal acts as it
  normally would. Batch-building processes ignore both (`ignore_stop_signals`).
- A batch that runs out of GPU memory (`OutOfMemory`) is skipped and counted; train.max_oom
  in a row stop the run with advice. Under torchrun one process cannot skip alone, so there
  it ends the run at once with the same advice.
- An update with a non-finite loss or gradient is skipped on the device by the step itself
  (step.py); `check_nonfinite` stops the run after train.max_nonfinite in a row.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from mtx.errors import MtxError


class StopSignals:
    """While `catching()`, SIGTERM and SIGINT set `received` (the signal's name) instead of
    ending the process; the loop acts on it between steps."""

    def __init__(self) -> None:
        self.received: str | None = None

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum, frame):  # only sets a flag: the loop acts on it between steps
            self.received = signal.Signals(signum).name
            signal.signal(signum, previous[signum])

        for s in previous:
            signal.signal(s, handler)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def ignore_stop_signals(worker_id: int) -> None:
    """A batch-building process ignores SIGTERM and SIGINT: torchrun and a terminal send them to
    the whole process group, and the trainer, not its loader, decides when to stop (the loader
    ends its processes; they also exit when the trainer dies)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class OutOfMemory:
    """Runs updates, skipping those whose batches run out of GPU memory."""

    def __init__(self, max_oom: int, max_tokens: int, joined: bool, rank: int) -> None:
        self.max_oom, self.max_tokens = max_oom, max_tokens
        self.joined, self.rank = joined, rank
        self.in_a_row = 0

    def advice(self) -> str:
        return (
            f"lower train.max_tokens (now {self.max_tokens}) and raise train.update_freq to "
            "keep the same batch size"
        )

    def run(
        self,
        update: Callable[[], dict],
        step: int,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        report: Callable[[], None],
    ) -> dict | None:
        """update(), or None when it ran out of memory at update number `step`: the partial
        gradients are dropped and `report()` says so; MtxError after train.max_oom in a row."""
        try:
            stats = update()
            self.in_a_row = 0
            return stats
        except torch.OutOfMemoryError:
            if self.joined:  # DDP's state (and the other processes) cannot skip alone
                raise MtxError(
                    f"process {self.rank} ran out of memory at step {step}: {self.advice()}, "
                    "then resume"
                ) from None
        # recover outside the except block, where the failed step's tensors are freed
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        self.in_a_row += 1
        report()
        if self.in_a_row >= self.max_oom:
            raise MtxError(f"out of memory on {self.in_a_row} batches in a row: {self.advice()}")
        return None


def check_nonfinite(worst: int, limit: int, step: int, last: Path) -> None:
    """Stop when `limit` updates in a row were skipped (`worst`: the longest streak so far)."""
    if worst >= limit:
        raise MtxError(
            f"{worst} updates in a row had a non-finite loss or gradient (up to step {step}; "
            "they were skipped): most likely the learning rate is too high (lower "
            f"train.lr_scale or raise train.warmup_steps); resume from {last} once changed"
        )
