"""What a profiler trace of training updates says beyond its kernel totals (gpu_parts.py's
profile part writes them with --trace): where the GPU waits, how long the host takes to
launch each compiled graph, and which operators launch the copies.

    python -m benchmarks.traces WORK/traces/base-compiled.json.gz [--updates 5]

prints one JSON object: the GPU's idle time an update and its largest gaps (with the kernels
on either side), the host's time a call of each compiled graph (torch.compile's
`## Call CompiledFxGraph` regions and its guard check, `TorchDynamo Cache Lookup`), and the
copy and cast kernels' time an update grouped by the operators that launched them.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

from benchmarks.gpu_parts import kernel_kind

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_REGIONS = ("## Call CompiledFxGraph", "TorchDynamo Cache Lookup")


def load(path: Path) -> list[dict]:
    """The trace's complete events (ph X)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def idle(events: list[dict], updates: int, largest: int = 15) -> dict:
    """The GPU's idle time an update, between its first and last device event, and the
    `largest` gaps (microseconds, the device events before and after)."""
    device = sorted((e for e in events if e.get("cat") in DEVICE), key=lambda e: e["ts"])
    end, gaps = device[0]["ts"], []
    for before, after in zip(device, device[1:]):
        end = max(end, before["ts"] + before["dur"])
        if after["ts"] > end:
            gaps.append((after["ts"] - end, before["name"][:80], after["name"][:80]))
    span = max(e["ts"] + e["dur"] for e in device) - device[0]["ts"]
    total = sum(g for g, _, _ in gaps)
    top = sorted(gaps, key=lambda g: -g[0])[:largest]
    return {
        "span_ms_per_update": span / 1e3 / updates,
        "idle_ms_per_update": total / 1e3 / updates,
        "largest_gaps": [{"us": g, "previous": a, "next": b} for g, a, b in top],
    }


def host_regions(events: list[dict]) -> dict:
    """Milliseconds of host time a call of each compiled graph and of the guard check."""
    calls = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation") and e["name"].startswith(HOST_REGIONS):
            calls[e["name"][:60]].append(e["dur"])
    return {
        name: {"calls": len(d), "ms_per_call": sum(d) / len(d) / 1e3} for name, d in calls.items()
    }


def copies_by_operator(events: list[dict], updates: int, depth: int = 4) -> dict:
    """Copy and cast kernels' milliseconds an update, by the last `depth` host operators
    around their launch (the launch found through the kernel's correlation id)."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}  # fmt: skip
    ops = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e["tid"]].append(e)
    starts = {}
    for tid, lst in ops.items():
        lst.sort(key=lambda e: e["ts"])
        starts[tid] = [e["ts"] for e in lst]
    out = defaultdict(float)
    for k in events:
        if k.get("cat") != "kernel" or kernel_kind(k["name"]) != "copies and fills":
            continue
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is None:
            continue
        lst = ops[launch["tid"]][: bisect.bisect_right(starts[launch["tid"]], launch["ts"])]
        chain = [o["name"] for o in lst if o["ts"] + o["dur"] >= launch["ts"]]
        out[" > ".join(chain[-depth:])] += k["dur"] / 1e3 / updates
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summary(path: Path, updates: int) -> dict:
    events = load(path)
    return idle(events, updates) | {
        "host_regions": host_regions(events),
        "copies_ms_per_update": copies_by_operator(events, updates),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--updates", type=int, default=5, help="updates the trace holds")
    args = ap.parse_args(argv)
    print(json.dumps(summary(args.trace, args.updates), indent=1))


if __name__ == "__main__":
    main()
