"""Train each architecture variant on the same data, budget and seed, and compare them.

    python -m benchmarks.architectures [--config configs/toy.yaml] [--set key=value ...]
        [--variants post,pre,...] [--parallel 1] [--work DIR]
        [--write BENCHMARKS.md --label toy-cpu] [--json]

The data is prepared once (`mtx prepare`) and shared by every run. Each variant is a set of
`model.*` overrides (VARIANTS below) on top of the config and the --set values, which are the
same for all: the budget (train.max_steps, train.max_minutes) and train.seed. Each run trains
through `mtx train` in its own process (--parallel N runs N at a time, for a GPU with room to
spare; their tokens/s then share it), then `mtx evaluate --split test` scores best.pt with
sacreBLEU. Reported: BLEU, chrF2, parameters (`mtx info`), median training tokens/s (source +
target, from metrics.jsonl), the training wall time, and the steps done.

--write FILE replaces the table between `<!-- compare:LABEL -->` and `<!-- /compare:LABEL -->`
in FILE (appending the block if it is not there yet).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtx.bench.harness import describe_machine, machine, mtx, timed
from mtx.checkpoint import RunDir
from mtx.config import ATTENTION_SCORES
from mtx.train.metrics import read_metrics

VARIANTS = {
    "post": [],  # the paper: post-norm, sinusoidal positions
    "pre": ["model.norm=pre"],
    "learned": ["model.positions=learned"],
    "relative": ["model.positions=relative"],
    # the recurrent baseline: an LSTM with each attention score, and a GRU
    **{
        f"rnn-lstm-{score}": ["model.arch=rnn", "model.rnn_cell=lstm", f"model.attention={score}"]
        for score in ATTENTION_SCORES
    },
    "rnn-gru-general": ["model.arch=rnn", "model.rnn_cell=gru", "model.attention=general"],
}


def sets(values: list[str]) -> list[str]:
    return [x for v in values for x in ("--set", v)]


def run_variant(name: str, config: Path, common: list[str], work: Path) -> dict:
    run = work / name
    run.mkdir(parents=True, exist_ok=True)
    prepared = run / "prepared"
    if not prepared.exists():
        prepared.symlink_to((work / "data" / "prepared").resolve())
    args = ["--config", config, *sets([*common, *VARIANTS[name], f"run_dir={run}"])]
    timing, _ = timed(lambda: mtx("train", *args), repeats=1, warmup=0)
    wall = timing.median
    test = mtx("evaluate", *args, "--split", "test", "--json").stdout
    scores = json.loads(test.splitlines()[-1])
    info = json.loads(mtx("info", RunDir(run).best, "--json").stdout)
    rows = read_metrics(RunDir(run).metrics)
    speeds = [r["tokens_per_s"] for r in rows if r.get("kind") == "train"]
    return {
        "variant": name,
        "overrides": VARIANTS[name],
        "architecture": info["architecture"],
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "parameters": info["parameters"],
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "train_seconds": wall,
        "steps": max((r["step"] for r in rows), default=0),
        "best_step": info["step"],
    }


def table(results: list[dict], command: str, machine: str) -> str:
    lines = [
        f"Command: `{command}` ({machine}).",
        "",
        "| variant | overrides | BLEU | chrF2 | parameters | tokens/s | train wall time | steps (best) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        speed = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        lines.append(
            f"| {r['variant']} | {' '.join(r['overrides']) or '(the paper)'} | {r['bleu']:.2f} "
            f"| {r['chrf']:.2f} | {r['parameters']:,} | {speed} | {r['train_seconds']:.0f} s "
            f"| {r['steps']} ({r['best_step']}) |"
        )
    return "\n".join(lines) + "\n"


def write_block(path: Path, label: str, text: str) -> None:
    begin, end = f"<!-- compare:{label} -->", f"<!-- /compare:{label} -->"
    doc = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text}{end}"
    if begin in doc and end in doc:
        doc = doc[: doc.index(begin)] + block + doc[doc.index(end) + len(end) :]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(doc)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/toy.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--parallel", type=int, default=1, help="runs trained at the same time")
    ap.add_argument("--work", type=Path, default=Path("runs/compare"))
    ap.add_argument("--write", type=Path, help="a Markdown file to put the table in")
    ap.add_argument("--label", default="toy-cpu", help="names the table's block in --write")
    ap.add_argument("--machine", help="the machine named beside the table (default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(
            f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}"
        )

    data = args.work / "data"
    mtx("prepare", "--config", args.config, *sets([*args.overrides, f"run_dir={data}"]))
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(
            pool.map(lambda n: run_variant(n, args.config, args.overrides, args.work), names)
        )
    if args.json:
        print(json.dumps(results))
        return
    command = "python -m benchmarks.architectures " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = table(results, command, args.machine or describe_machine(machine()))
    print(text, end="")
    if args.write:
        write_block(args.write, args.label, text)


if __name__ == "__main__":
    main()
