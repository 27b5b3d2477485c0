"""How much mtx learns per update: train for a fixed number of updates on Multi30k de->en with
the settings of the fairseq comparison in BENCHMARKS.md ("Learning per update"), for several
seeds, and print the training and validation loss curves (in bits, as fairseq prints them) and
the test2016 sacreBLEU of each seed's last checkpoint.

    python -m benchmarks.per_update [--updates 568] [--seeds 1 2 3] [--jobs 1] [--device cpu]
        [--set key=value ...] [--data data/multi30k] [--out runs/per-update]

The data are prepared once (joint SentencePiece BPE 8k) and copied into each seed's run. The
settings (SETTINGS below): d_model 256, 3+3 layers, 4 heads, d_ff 1024, dropout 0.1, shared
embeddings, post-norm, label smoothing 0.1, Adam (0.9, 0.98), inverse-sqrt schedule with 500
warm-up updates to a peak learning rate of 1e-3, 4096-token batches, beam 4. Training and
decoding run in fp32 on any device, so a GPU gives the CPU's numbers up to rounding. `--set`
adds or overrides settings (one change at a time, to measure what it does); `--jobs N` trains
N seeds at once (on a GPU, which one small model leaves mostly idle).

`--ablate NAME` (repeatable) makes one of the differences between fairseq's initialisation or
schedule and mtx's `model.init: xavier` that no setting expresses, by patching mtx in the
training processes only (ABLATIONS below): the parts of `model.init: fairseq` one at a time,
and fairseq's learning-rate steps. Use it with `--set model.init=xavier`.
"""

from __future__ import annotations

import argparse
import json
import math
import runpy
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtx.bench.harness import ROOT, describe_machine, machine, result, timed
from mtx.checkpoint import RunDir
from mtx.train.metrics import read_metrics

SETTINGS = [
    "data.src_lang=de",
    "data.tgt_lang=en",
    "data.vocab_size=8000",
    "model.dropout=0.1",
    "train.warmup_steps=500",
    "train.lr_scale=0.3578",  # 0.3578 * 256^-0.5 * 500^-0.5 = 1e-3 at the peak
    "train.max_minutes=0",
    "train.bleu_every=0",  # validation loss only; test BLEU at the end
    "train.log_every=50",
    "train.valid_every=50",
    "train.precision=fp32",
    "decode.beam=4",
]
LN2 = math.log(2)
ABLATIONS = {
    "qk_gain": "W^Q and W^K at 1/sqrt(2) of Xavier's scale",
    "v_gain": "W^V at 1/sqrt(2) of Xavier's scale",
    "qkv_bias": "Q/K/V biases uniform in +-1/sqrt(d_model), as nn.Linear's",
    "ffn_linear": "feed-forward weights and biases as nn.Linear's",
    "lr0": "update 1 at learning rate 0, update n at the paper's rate for n - 1 (fairseq's steps)",
}


def patch(ablate: set[str]) -> None:
    """Make the named ABLATIONS in mtx, in this process."""
    import torch

    from mtx.model import transformer
    from mtx.train import step

    reset, rate = transformer.Transformer.reset_parameters, step.rate

    def patched_reset(model) -> None:
        reset(model)
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "in_proj"):
                    d = m.d_model
                    if "qk_gain" in ablate:
                        m.in_proj.weight[: 2 * d].mul_(2**-0.5)
                    if "v_gain" in ablate:
                        m.in_proj.weight[2 * d :].mul_(2**-0.5)
                    if "qkv_bias" in ablate:
                        m.in_proj.bias.uniform_(-(d**-0.5), d**-0.5)
                if hasattr(m, "fc1") and "ffn_linear" in ablate:
                    m.fc1.reset_parameters()
                    m.fc2.reset_parameters()

    transformer.Transformer.reset_parameters = patched_reset
    if "lr0" in ablate:
        step.rate = lambda n, *args: 0.0 if n == 1 else rate(n - 1, *args)


# `python -m benchmarks.per_update --mtx-with ABLATIONS ARGS...`: the mtx CLI with the
# ablations (comma-separated) made, in the process that trains.
MTX_WITH = "--mtx-with"


def mtx(*args: str, log: Path | None = None, ablate: list[str] | None = None) -> str:
    command = [sys.executable, "-m", "mtx", *args]
    if ablate:
        command = [sys.executable, "-m", "benchmarks.per_update", MTX_WITH, ",".join(ablate)]
        command += args
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"mtx {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def options(settings: list[str]) -> list[str]:
    return [x for s in settings for x in ("--set", s)]


def train_and_score(seed: int, settings: list[str], out: Path, args) -> dict:
    run = out / f"seed-{seed}"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(out / "data" / "prepared", run / "prepared")
    sets = settings + [f"run_dir={run}", f"train.seed={seed}", f"train.device={args.device}"]
    train = ("train", "--config", "configs/multi30k.yaml", *options(sets))
    timing, _ = timed(lambda: mtx(*train, log=run / "train.log", ablate=args.ablate), 1, 0)
    seconds = timing.median
    last = RunDir(run).last
    scores = json.loads(
        mtx(
            "evaluate", "--checkpoint", str(last), "--split", "test", "--json",
            "--device", args.device, "--dtype", "fp32",
        )
    )  # fmt: skip
    records = read_metrics(RunDir(run).metrics)
    return {
        "seed": seed,
        "seconds": seconds,
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "train": {r["step"]: r["loss"] / LN2 for r in records if r["kind"] == "train"},
        "valid": {r["step"]: r["valid_loss"] / LN2 for r in records if r["kind"] == "valid"},
    }


def curve(title: str, results: list[dict], key: str) -> None:
    steps = sorted(set().union(*(r[key] for r in results)))
    seeds = "  ".join(f"seed {r['seed']:>2}" for r in results)
    print(f"\n{title}\n  step  {seeds}     mean")
    for step in steps:
        values = [r[key].get(step, math.nan) for r in results]
        row = "  ".join(f"{v:7.3f}" for v in values)
        print(f"  {step:4d}  {row}  {statistics.fmean(values):7.3f}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [MTX_WITH]:  # a training process of an ablation (see `mtx` above)
        patch(set(argv[1].split(",")))
        sys.argv = ["mtx", *argv[2:]]
        return runpy.run_module("mtx", run_name="__main__")  # `python -m mtx ARGS`, patched
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=568)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--data", type=Path, default=ROOT / "data/multi30k")
    parser.add_argument("--out", type=Path, default=ROOT / "runs/per-update")
    parser.add_argument("--ablate", action="append", default=[], choices=sorted(ABLATIONS))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    data = args.data.resolve()
    splits = [f"data.{s}={data / f}" for s, f in (("train", "train"), ("valid", "val"))]
    settings = (
        SETTINGS
        + splits
        + [f"data.test={data / 'test2016'}", f"train.max_steps={args.updates}"]
        + args.set
    )
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    prepare = settings + [f"run_dir={out / 'data'}"]
    mtx("prepare", "--config", "configs/multi30k.yaml", *options(prepare))
    print(f"mtx, {args.updates} updates on {args.device} ({describe_machine(machine())}); "
          f"settings: {' '.join(settings[:12])}")  # fmt: skip
    for change in args.set:
        print(f"changed: {change}")
    for name in args.ablate:
        print(f"changed: {ABLATIONS[name]} (--ablate {name})")
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda s: train_and_score(s, settings, out, args), args.seeds))
    curve("training loss (bits, mean of each 50-update window)", results, "train")
    curve("validation loss (bits)", results, "valid")
    print("\ntest2016 sacreBLEU (last checkpoint, beam 4)")
    for r in results:
        print(
            f"  seed {r['seed']}: BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f} (trained in {r['seconds']:.0f} s)"
        )
    bleus = [r["bleu"] for r in results]
    spread = statistics.stdev(bleus) if len(bleus) > 1 else 0.0
    print(f"  mean BLEU {statistics.fmean(bleus):.2f} (sd {spread:.2f}), "
          f"mean chrF {statistics.fmean(r['chrf'] for r in results):.2f}")  # fmt: skip
    if args.json:
        report = result("per_update", {"results": results}, settings=settings)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
