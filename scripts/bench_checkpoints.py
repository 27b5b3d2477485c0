"""What validation BLEU costs in a run, and the test BLEU of the last checkpoint, of the average
of the last N and of the ensemble of the last N, side by side.

    python scripts/bench_checkpoints.py --config configs/toy.yaml [--set key=value ...] [--last 5]
    python scripts/bench_checkpoints.py --run runs/toy [--last 5]   # an existing run: no training

With --config, it prepares and trains RUN (run_dir, or --set run_dir=...) from scratch, timing
`mtx train`; the share of validation BLEU is the sum of the validations' `bleu_seconds`
(metrics.jsonl) over that wall time. Then it scores the run's test split with `mtx evaluate`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def mtx(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "mtx", *args], capture_output=True, text=True, check=False
    )
    if result.returncode:
        sys.exit(f"mtx {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def run_dir(config: str, sets: list[str]) -> Path:
    values = yaml.safe_load(Path(config).read_text())
    for s in sets:
        key, value = s.split("=", 1)
        if key == "run_dir":
            return Path(value)
    return Path(values["run_dir"])


def bleu(*checkpoints: Path) -> float:
    options = [x for c in checkpoints for x in ("--checkpoint", str(c))]
    out = mtx("evaluate", *options, "--split", "test", "--device", "cpu", "--json")
    return json.loads(out)["bleu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--run", type=Path)
    parser.add_argument("--last", type=int, default=5)
    args = parser.parse_args()
    if args.config:
        run = run_dir(args.config, args.set)
        options = [x for s in args.set for x in ("--set", s)]
        mtx("prepare", "--config", args.config, *options)
        start = time.monotonic()
        mtx("train", "--config", args.config, *options, "--overwrite")
        seconds = time.monotonic() - start
        valid = [
            r
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "valid"
        ]
        spent = sum(r.get("bleu_seconds", 0.0) for r in valid)
        print(f"mtx train: {seconds:.1f} s wall, {len(valid)} validations")
        print(
            f"validation BLEU: {spent:.1f} s, {100 * spent / seconds:.1f}% of the wall time "
            f"({spent / max(1, sum('valid_bleu' in r for r in valid)):.2f} s each)"
        )
        for r in valid:
            print(
                f"  step {r['step']}: valid BLEU {r.get('valid_bleu', '-')}, loss {r['valid_loss']:.3f}"
            )
    elif args.run:
        run = args.run
    else:
        parser.error("give --config (train, then score) or --run (score)")
    ckpts = run / "checkpoints"
    steps = sorted(ckpts.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))[-args.last :]
    if len(steps) < args.last:
        sys.exit(f"{ckpts} holds {len(steps)} step checkpoints, fewer than --last {args.last}")
    with tempfile.TemporaryDirectory() as tmp:
        averaged = Path(tmp) / "average.pt"
        mtx("average", *map(str, steps), "--output", str(averaged))
        names = ", ".join(p.stem for p in steps)
        print(f"test BLEU ({run}, the last {args.last}: {names}):")
        print(f"  last checkpoint     {bleu(steps[-1]):6.2f}")
        print(f"  best.pt             {bleu(ckpts / 'best.pt'):6.2f}")
        print(f"  average of last {args.last}   {bleu(averaged):6.2f}")
        print(f"  ensemble of last {args.last}  {bleu(*steps):6.2f}")


if __name__ == "__main__":
    main()
