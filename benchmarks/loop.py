"""A real `mtx train` beside `mtx bench train` on the same settings: what the loop costs.

    python -m benchmarks.loop --config configs/multi30k.yaml --prepared RUN/prepared \
        [--steps 400] [--set key=value ...] [--checkout DIR ...] [--json]

`mtx bench train` times the update alone (train/step.py), on batches built beforehand; a run
also builds its batches (background workers), goes from epoch to epoch, logs and validates.
For each checkout (this one by default; --checkout names others, for a before/after in one
call), this runs both on the prepared data, each in a fresh run directory that links it:
the bench over --bench-steps updates after as many of warm-up, and `mtx train` for --steps
updates that validates by loss once, at its end (validation time is left out of its logged
speed). Reported: the bench's tokens/s, the run's logged tokens/s (the median of its log
windows after the first, and the slowest), their ratio, and the run's wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from mtx.bench.harness import ROOT, mtx, result
from mtx.train.metrics import read_metrics


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.loop", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--config", required=True)
    ap.add_argument("--prepared", required=True, type=Path, help="RUN/prepared of that config")
    ap.add_argument("--steps", type=int, default=400, help="updates of the real run")
    ap.add_argument("--bench-steps", type=int, default=40)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], dest="sets", help="key=value")
    ap.add_argument("--checkout", action="append", type=Path, help="other checkouts to run")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def linked_run(prepared: Path, work: Path, name: str) -> Path:
    run = work / name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    os.symlink(prepared.resolve(), run / "prepared")
    return run


def measure(args, checkout: Path, work: Path) -> dict:
    """The bench and the real run of one checkout (its `python -m mtx`, run from its root)."""
    sets = [x for item in args.sets for x in ("--set", item)]
    bench_run = linked_run(args.prepared, work, "bench")
    steps = str(args.bench_steps)
    bench = mtx("bench", "train", "--config", args.config, "--set", f"run_dir={bench_run}",
                *sets, "--steps", steps, "--warmup", steps, "--json", cwd=checkout)  # fmt: skip
    bench = json.loads(bench.stdout.strip().splitlines()[-1])
    run = linked_run(args.prepared, work, "train")
    items = [f"run_dir={run}", f"train.max_steps={args.steps}", f"train.log_every={args.log_every}"]
    items += [f"train.valid_every={args.steps}", "train.bleu_every=0", "train.max_minutes=0"]
    start = time.monotonic()
    mtx("train", "--config", args.config, *sets, *[x for i in items for x in ("--set", i)],
        cwd=checkout)  # fmt: skip
    wall = time.monotonic() - start
    windows = [r["tokens_per_s"] for r in read_metrics(run / "metrics.jsonl", "train")][1:]
    logged = statistics.median(windows)
    bench_speed = bench["tokens_per_s"]
    return {
        "checkout": str(checkout),
        "bench_tokens_per_s": bench_speed,
        "run_tokens_per_s": logged,
        "run_slowest_window": min(windows),
        "ratio": logged / bench_speed,
        "run_wall_seconds": wall,
        "steps": args.steps,
    }


def main(argv=None) -> None:
    args = arguments(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for checkout in [ROOT, *(args.checkout or [])]:
            rows.append(measure(args, checkout.resolve(), Path(tmp)))
    if args.json:
        print(json.dumps(result("loop", {"rows": rows}, config=args.config, sets=args.sets)))
        return
    print(
        "| checkout | bench tokens/s | run tokens/s (slowest window) | run / bench | run wall s |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['checkout']} | {r['bench_tokens_per_s']:,.0f} | {r['run_tokens_per_s']:,.0f} "
            f"({r['run_slowest_window']:,.0f}) | {r['ratio']:.2f} | {r['run_wall_seconds']:.1f} |"
        )


if __name__ == "__main__":
    main()
