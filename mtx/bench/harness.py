"""The one harness every benchmark of the suite uses.

- `timed`: a warm-up, then repeats, each timed alone; `Timing` gives the median, the best and
  the spread. A benchmark never reads the clock itself.
- `PeakMemory` and `memory`: the one memory measure, the proportional set size (PSS, from
  /proc/PID/smaps_rollup) of a process and all its descendants, with its anonymous part (what
  is not file pages, such as memory-mapped Arrow files). A page that processes share counts
  once over all of them, so a server with decoding processes or `mtx prepare` with encoding
  workers is measured as one. `PeakMemory` samples it in a thread while a benchmark runs;
  `memory` reads it once. (A GPU's memory is the device's own figure: torch's peak allocated.)
- `mtx`: runs `python -m mtx ARGS` in a subprocess, the way a user runs it.
- `result`: a benchmark's JSON result, naming the machine (CPU model, ATen's kernel set,
  cores, GPU, torch version) and the commit it measured.

The server launcher for benchmarks and tests lives beside it (server.py).
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The directory that holds the mtx package: its checkout, when mtx runs from one (as the
# investigations of benchmarks/ do), where the commit measured is read.
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Timing:
    """Seconds of each timed repeat, after `warmup` untimed runs."""

    seconds: list[float]
    warmup: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: how much the repeats disagree."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "median_s": self.median,
            "best_s": self.best,
            "spread": self.spread,
            "repeats": len(self.seconds),
            "warmup": self.warmup,
            "seconds": self.seconds,
        }


def timed(
    run: Callable[[], Any],
    repeats: int = 3,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
    before: Callable[[], None] | None = None,
) -> tuple[Timing, Any]:
    """Call `run()` `warmup` times, then `repeats` times, timing each call alone; `sync()` (a
    device's synchronisation) runs before the clock is read, `before()` before each timed
    call, untimed. Returns the timing and the last call's result."""
    sync = sync or (lambda: None)
    result = None
    for _ in range(warmup):
        result = run()
    sync()
    seconds = []
    for _ in range(repeats):
        if before:
            before()
        start = time.perf_counter()
        result = run()
        sync()
        seconds.append(time.perf_counter() - start)
    return Timing(seconds, warmup), result


# --- memory: PSS of a process tree -------------------------------------------------------


def tree(pid: int) -> list[int]:
    """Process `pid` and its descendants (those alive now)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue  # ended meanwhile
    return out


@dataclass
class MemoryUse:
    pss: int = 0  # bytes: proportional set size, summed over the processes
    anon: int = 0  # bytes of it that are anonymous (not file pages)

    def __or__(self, other: MemoryUse) -> MemoryUse:  # the larger of each
        return MemoryUse(max(self.pss, other.pss), max(self.anon, other.anon))


def memory(pids: list[int]) -> MemoryUse:
    """The PSS of the processes `pids` together (processes that ended count 0)."""
    use = MemoryUse()
    for p in pids:
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        use.pss += _kib(rollup, "Pss") * 1024
        use.anon += _kib(rollup, "Pss_Anon") * 1024
    return use


def _kib(rollup: str, name: str) -> int:
    found = re.search(rf"^{name}:\s+(\d+) kB", rollup, re.M)
    return int(found.group(1)) if found else 0


@dataclass
class PeakMemory:
    """The peak of `memory(tree(pid))` while the `with` block runs, sampled every `every`
    seconds in a thread (and once at the start and the end); `sampler_cpu_s` is what the
    sampling itself cost (reading smaps walks every mapping of a process)."""

    pid: int = field(default_factory=os.getpid)
    every: float = 0.5
    peak: MemoryUse = field(default_factory=MemoryUse)
    sampler_cpu_s: float = 0.0
    samples: list[tuple[float, MemoryUse]] = field(default_factory=list)  # (clock(), use)

    def __enter__(self) -> PeakMemory:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while True:
            self._take()
            if self._stop.wait(self.every):
                break
        self._take()

    def _take(self) -> None:
        use = memory(tree(self.pid))
        self.samples.append((clock(), use))
        self.peak = self.peak | use
        self.sampler_cpu_s = time.thread_time()

    def peak_between(self, start: float, end: float) -> MemoryUse:
        """The peak of the samples taken from `start` to `end` (times of `clock()`)."""
        peak = MemoryUse()
        for t, use in self.samples:
            if start <= t < end:
                peak = peak | use
        return peak

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def clock() -> float:
    """The harness's clock (seconds, monotonic): memory samples and timestamped lines."""
    return time.perf_counter()


def timestamped(stream) -> list[tuple[float, str]]:
    """Each line of a text stream as it arrives, with `clock()`'s time."""
    return [(clock(), line) for line in stream]


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each process so far."""
    out = {}
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


# --- running mtx, and what a result says about where it was measured ------------------------


def mtx(*args: str, timeout: float | None = None, check: bool = True, **kwargs):
    """`python -m mtx ARGS` in a subprocess, its output captured; with `check`, a failure
    raises RuntimeError with the end of its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "mtx", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"mtx {' '.join(map(str, args[:2]))} failed: {proc.stderr[-3000:]}")
    return proc


def machine() -> dict[str, Any]:
    """The machine a figure was measured on."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1).strip()
    except (OSError, AttributeError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "cores": cores,
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def commit() -> str | None:
    """The commit of the tree being measured (with "-dirty" if it has uncommitted changes),
    or None when mtx does not run from a git checkout (an installed copy)."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True
        )
        if top.returncode or Path(top.stdout.strip()).resolve() != ROOT:
            return None
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def result(benchmark: str, figures: dict[str, Any], **settings: Any) -> dict[str, Any]:
    """A benchmark's JSON result: its figures, beside the benchmark's name, its settings, the
    machine and the commit it measured."""
    return {
        "benchmark": benchmark,
        "machine": machine(),
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
        **figures,
    }


def describe_machine(m: dict[str, Any]) -> str:
    """One line for a table's heading."""
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{m['cpu']} ({m['capability']}), {m['cores']} cores{gpu}, torch {m['torch']}"
