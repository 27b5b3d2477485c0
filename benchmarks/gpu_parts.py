"""The parts of gpu_report.py: each runs one measurement and returns its figures.

`Sizes` says what each part runs: the real sizes on a GPU, or tiny ones on the CPU
(--smoke). A part runs in a process of its own (gpu_report.py's run_part) and may take until
`args.deadline`; it runs mtx's commands with the harness (`python -m mtx`, from the
repository root, where the configs are).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mtx.bench import harness
from mtx.bench.harness import ROOT, timed
from mtx.checkpoint import Checkpoint, Manifest, RunDir
from mtx.train.metrics import read_metrics


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1))


class Sizes:
    """What each part runs: the real sizes, or tiny ones on the CPU (--smoke)."""

    def __init__(self, args) -> None:  # gpu_report.py's arguments
        self.smoke = args.smoke
        self.prepared = args.work / "m30k"
        if args.smoke:
            self.data = ["data.train=toy:train", "data.valid=toy:valid", "data.test=toy:test"]
            self.data += ["data.vocab_size=400", "train.device=cpu", "train.threads=1"]
            tiny = ["model.d_model=32", "model.d_ff=64", "model.n_heads=2"]
            tiny += ["model.encoder_layers=1", "model.decoder_layers=1"]
            self.model = {"base": tiny, "big": tiny}
            self.run = [*tiny, "train.max_tokens=512"]  # the runs of train, fp16, nccl, oom
            self.bench_tokens, self.bench_steps = 512, 3
            self.minutes, self.steps = 0.0, 8
            self.batches, self.decode_lines = (4, 16), 24
            self.precision = "fp32"
            self.compile_backend = ["train.compile_backend=eager"]  # traced, torch's kernels
        else:
            d = args.data
            self.data = [f"data.train={d}/train", f"data.valid={d}/val", f"data.test={d}/test2016"]
            self.model = {"base": [], "big": []}
            self.run = []
            self.bench_tokens, self.bench_steps = 25000, 100  # 200 updates: the loss check
            self.minutes, self.steps = args.minutes, 0
            self.batches, self.decode_lines = tuple(map(int, args.batches.split(","))), 0
            self.precision = "bf16"
            self.compile_backend = []
        self.config = "configs/toy.yaml" if args.smoke else "configs/multi30k.yaml"


def mtx(*args: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m mtx ARGS` from the repository root (with `env` added to the environment),
    its failure left to `checked`."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {})
    return harness.mtx(*args, timeout=timeout, check=False, cwd=ROOT, env=env)


def left(args, most: float) -> float:
    """Seconds a step of the running part may take: `most`, or what its deadline leaves."""
    return max(1.0, min(most, args.deadline - time.time())) if args.deadline else most


def checked(proc: subprocess.CompletedProcess) -> str:
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def sets(items: list[str]) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def run_dir(args, sizes: Sizes, name: str) -> Path:
    """A fresh run directory holding a copy of the prepared data."""
    path = args.work / name
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(sizes.prepared / "prepared", path / "prepared")
    return path


# --- the parts: each returns its figures ------------------------------------------------------


def part_prepare(args, sizes: Sizes) -> dict:
    shutil.rmtree(sizes.prepared, ignore_errors=True)
    items = [f"run_dir={sizes.prepared}", *sizes.data]
    command = ("prepare", "--config", sizes.config, *sets(items))
    timing, _ = timed(lambda: checked(mtx(*command, timeout=left(args, 150))), 1, 0)
    manifest = Manifest.read(RunDir(sizes.prepared).data.manifest)
    return {"seconds": timing.median, "vocab_size": manifest.vocab_size}


# The training variants raced for each model: their settings over the defaults (bf16 autocast;
# each says whether it compiles). "static": eager over fixed batch shapes (the reference the
# graphs variants' losses are compared with: their batches are not eager's). "graphs": static
# batch shapes, each a CUDA graph (train.static_shapes with compile_mode reduce-overhead; on
# the CPU's smoke run, traced without graphs). "cpp-wrapper": inductor's generated code
# launches the kernels from C++, not Python (an environment variable, ENV: below, as a user
# sets it for `mtx train`; no effect on the smoke run's traced step). The names are what
# --variants and --train-variant take.
VARIANTS = {
    "eager": ["train.compile=false"],  # explicit: train.compile's default (auto) compiles on CUDA
    "static": ["train.static_shapes=true", "train.compile=false"],
    "compiled": ["train.compile=true"],
    "bf16-weights": ["train.precision=bf16-weights", "train.compile=false"],
    "bf16-weights+compiled": ["train.precision=bf16-weights", "train.compile=true"],
    "compiled+graphs": ["train.compile=true", "train.static_shapes=true", "GRAPHS"],
    "compiled+cpp-wrapper": ["train.compile=true", "ENV:TORCHINDUCTOR_CPP_WRAPPER=1"],
    "bf16-weights+compiled+graphs": [
        "train.precision=bf16-weights", "train.compile=true", "train.static_shapes=true", "GRAPHS",
    ],
}  # fmt: skip


def variant(sizes: Sizes, name: str) -> list[str]:
    """A variant's settings for this run (reduce-overhead on CUDA only)."""
    graphs = [] if sizes.smoke else ["train.compile_mode=reduce-overhead"]
    items = [item for item in VARIANTS[name] if not item.startswith("ENV:")]
    return [x for item in items for x in (graphs if item == "GRAPHS" else [item])]


def variant_env(name: str) -> dict[str, str]:
    """The environment variables a variant sets (its ENV:NAME=VALUE items)."""
    pairs = (item[4:].split("=", 1) for item in VARIANTS[name] if item.startswith("ENV:"))
    return dict(pairs)


def bench_args(sizes: Sizes, model: str, variant_sets: list[str], tokens: int):
    lengths = sizes.prepared / "prepared" / "train"
    vocab = 400 if sizes.smoke else 37000
    items = [f"data.vocab_size={vocab}", f"train.max_tokens={tokens}"]
    items += [f"train.precision={sizes.precision}", *sizes.model[model], *sizes.compile_backend]
    items += variant_sets  # after the precision: bf16 weights replace it
    if sizes.smoke:
        items += ["train.device=cpu", "train.threads=1", "data.max_len=100"]
    steps = sizes.bench_steps
    warmup = steps  # the warm-up runs the timed updates: every shape is planned (and compiled)
    config = f"configs/{model}.yaml"
    return ["bench", "train", "--config", config, *sets(items), "--lengths-from", str(lengths)] + [
        "--join", "2-4", "--steps", str(steps), "--warmup", str(warmup), "--json",
    ]  # fmt: skip


def part_bench(args, sizes: Sizes) -> dict:
    """Every variant of --variants for base, then for big; each with its ratio to eager."""
    out = {}
    models = ["base"] if sizes.smoke else ["base", "big"]  # smoke: one tiny model suffices
    for model in models:
        for name in args.variants.split(","):
            label = f"{model} {name}"
            try:
                proc = mtx(*bench_args(sizes, model, variant(sizes, name), sizes.bench_tokens),
                           timeout=left(args, 240), env=variant_env(name))  # fmt: skip
                out[label] = json.loads(checked(proc).strip().splitlines()[-1])
                eager = out.get(f"{model} eager", {}).get("tokens_per_s")
                out[label]["vs_eager"] = out[label]["tokens_per_s"] / eager if eager else None
            except Exception as e:  # one failed configuration: say so, go on with the others
                out[label] = {"error": str(e)[-1500:]}
            write_json(args.work / "parts" / "bench.partial.json", out)  # kept if it fails
    return out


def part_profile(args, sizes: Sizes) -> dict:
    """torch.profiler over 5 updates of base on WMT-like lengths: eager, compiled, and with
    bf16 weights (where autocast's casts go)."""
    import datasets
    import torch

    from mtx.bench.train import joined_lengths, synthetic_batches
    from mtx.config import load_config
    from mtx.data.batching import lengths

    cuda = torch.cuda.is_available() and not sizes.smoke
    src, tgt = lengths(datasets.load_from_disk(str(sizes.prepared / "prepared" / "train")))
    out = {}
    for name in ("eager", "compiled", "bf16-weights"):
        cli = bench_args(sizes, "base", variant(sizes, name), sizes.bench_tokens)
        cfg = load_config(ROOT / "configs/base.yaml", [cli[i + 1] for i, x in enumerate(cli)
                                                       if x == "--set"])  # fmt: skip
        real = joined_lengths(src, tgt, (2, 4), cfg.data.max_len + 1, 20_000, cfg.train.seed)
        batches = synthetic_batches(cfg, cfg.data.vocab_size, 5, 30, real)
        trace = args.work / "traces" / f"base-{name}.json" if args.trace else None
        out[f"base {name}"] = profiled(cfg, batches, cuda, trace)
    return out


# Kernel names by what they compute, first match wins (attention before the matrix products:
# flash attention's kernels are CUTLASS ones too).
KINDS = (
    ("communication", ("nccl",)),
    ("attention", ("fmha", "flash", "attention", "efficient_attention")),
    ("matrix products", ("gemm", "nvjet", "xmma", "cutlass", "matmul", "sm90_", "sm80_")),
    ("generated (triton)", ("triton",)),
    ("optimizer", ("adam", "foreach")),
    ("copies and fills", ("copy", "memcpy", "memset", "fill")),
    ("elementwise and reductions", ("elementwise", "vectorized", "reduce", "softmax", "norm")),
)


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, keys in KINDS if any(k in lower for k in keys)), "other")


def profiled(cfg, batches: list[dict], cuda: bool, trace: Path | None = None) -> dict:
    """One update per batch under torch.profiler, after two warm-up passes (compiling and
    planning every shape): wall and kernel time per update, that time by kind of kernel
    (`kernel_kind`), the top 12 kernels (CPU operations without a GPU), and what compiling
    took. `trace`: the profiler's Chrome trace, gzipped, to `trace`.gz."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mtx.model.build import make_model
    from mtx.train.compiled import stats
    from mtx.train.step import build_step

    torch.manual_seed(1)
    before = stats()
    device = torch.device("cuda" if cuda else "cpu")
    run = build_step(cfg, make_model(cfg.model, cfg.data.vocab_size).to(device), device)

    def step(b: dict, n: int) -> None:
        run([b], n)

    for n, b in enumerate(batches * 2):
        step(b, n + 1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    before, after = before.record(), stats().record()
    compiling = {k: v - before[k] for k, v in after.items()}  # this model's, warm-up's
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        timing, _ = timed(lambda: [step(b, 100 + n) for n, b in enumerate(batches)], 1, 0, sync)
    wall = timing.median / len(batches)
    rows = prof.key_averages()
    if cuda:  # the kernels alone: an operator's device time is its kernels' time again
        rows = [r for r in rows if r.device_type == torch.autograd.DeviceType.CUDA]
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    per_update = sum(getattr(r, attr) for r in rows) / 1e6 / len(batches)
    top = sorted(rows, key=lambda r: -getattr(r, attr))[:12]
    kinds: dict[str, float] = {}
    for r in rows:
        kind = kernel_kind(r.key)
        kinds[kind] = kinds.get(kind, 0.0) + getattr(r, attr) / 1e3 / len(batches)
    if trace is not None:
        export_trace(prof, trace)
    return compiling | {
        "kinds_ms_per_update": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "wall_ms_per_update": wall * 1e3,
        "kernel_ms_per_update": per_update * 1e3,
        "busy": per_update / wall if cuda else None,
        "top": [
            {
                "name": r.key[:90],
                "calls": r.count // len(batches),
                "ms_per_update": getattr(r, attr) / 1e3 / len(batches),
            }
            for r in top
        ],  # fmt: skip
    }


def export_trace(prof, path: Path) -> None:
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    with open(path, "rb") as f, gzip.open(f"{path}.gz", "wb") as z:
        shutil.copyfileobj(f, z)
    path.unlink()


def part_train(args, sizes: Sizes) -> dict:
    run = run_dir(args, sizes, "train")
    items = [f"run_dir={run}", *sizes.data, *sizes.run, f"train.precision={sizes.precision}"]
    items += variant(sizes, args.train_variant)
    if sizes.smoke:
        items += [f"train.max_steps={sizes.steps}", "train.valid_every=4", "train.log_every=2"]
        items += ["train.valid_bleu_lines=8", *sizes.compile_backend]
    else:
        items += [f"train.max_minutes={sizes.minutes}", "train.max_steps=1000000"]
    command = ("train", "--config", sizes.config, *sets(items))
    env = variant_env(args.train_variant)
    wall = timed(lambda: checked(mtx(*command, timeout=left(args, 1e9), env=env)), 1, 0)[0].median
    train, valid = (read_metrics(RunDir(run).metrics, kind) for kind in ("train", "valid"))
    ckpt = RunDir(run).best
    test = json.loads(
        checked(mtx("evaluate", "--checkpoint", str(ckpt), "--split", "test", "--json",
                    timeout=left(args, 240))).strip().splitlines()[-1]
    )  # fmt: skip
    bench_items = [x for x in items if not x.startswith(("train.max_", "train.valid", "train.log"))]
    steps = sizes.bench_steps * 2
    proc = mtx("bench", "train", "--config", sizes.config, *sets(bench_items), "--steps", str(steps),
               "--warmup", str(steps), "--json", timeout=left(args, 300))  # fmt: skip
    bench = json.loads(checked(proc).strip().splitlines()[-1])
    logged = [r["tokens_per_s"] for r in train[1:]] or [r["tokens_per_s"] for r in train]
    return {
        "wall_seconds": wall,
        "steps": train[-1]["step"] if train else None,
        "logged_tokens_per_s": statistics.median(logged) if logged else None,
        "bench_tokens_per_s": bench["tokens_per_s"],
        "valid_seconds": sum(r.get("valid_seconds", 0.0) for r in valid),
        "bleu_seconds": sum(r.get("bleu_seconds", 0.0) for r in valid),
        "best_valid_bleu": max((r.get("valid_bleu", 0.0) for r in valid), default=None),
        "test": test,
        "checkpoint": str(ckpt),
        "compile_seconds": train[-1].get("compile_seconds") if train else None,
        "compilations": train[-1].get("compilations") if train else None,
    }


def decode_lines(args, sizes: Sizes) -> list[str]:
    """What the decode part translates: Multi30k's val, test2016 and test2017 (the toy test
    split's first lines with --smoke)."""
    from mtx.data.sources import read_lines

    if sizes.smoke:
        from mtx.data import toy

        return [src for src, _ in toy.split_pairs("test")][: sizes.decode_lines]
    return [
        x for name in ("val", "test2016", "test2017") for x in read_lines(args.data / f"{name}.en")
    ]


def part_decode(args, sizes: Sizes) -> dict:
    """Each search at each batch size, beam 4 and greedy; outputs compared with the same
    search's at the smallest batch, and with the shrinking search's at the same batch."""

    from mtx.decode.translator import Translator

    device = "cpu" if sizes.smoke else "cuda"
    ckpt = args.checkpoint or RunDir(args.work / "train").best
    sets = [f"decode.dtype={sizes.precision}", f"decode.batch_tokens={1 << 30}"]
    searches = ["shrinking", "static"] + ([] if sizes.smoke else ["graphs"])
    by_search = {s: Translator.from_checkpoints(ckpt, [*sets, f"decode.search={s}"], device=device)
                 for s in searches}  # fmt: skip
    codec = by_search["shrinking"].parts.codec
    ids = sorted((codec.encode(x) for x in decode_lines(args, sizes)), key=len)
    out, first, shrinking = {}, {}, {}
    for beam in (4, 1):
        for search, tr in by_search.items():
            for size in sizes.batches:
                groups = [ids[i : i + size] for i in range(0, len(ids), size)]
                hyps, timing = decode_timed(tr, tr.options(beam=beam), groups, search, device)
                key = (beam, search)
                same = None
                if key in first:
                    same = sum(a == b for a, b in zip(hyps, first[key])) / len(hyps)
                else:
                    first[key] = hyps
                if search == "shrinking":
                    shrinking[(beam, size)] = hyps
                versus = shrinking.get((beam, size))
                label = f"beam {beam}, batch {size}" + (
                    "" if search == "shrinking" else f", {search}"
                )
                out[label] = {
                    "lines": len(hyps),
                    "seconds": timing.median,
                    "tgt_tokens_per_s": sum(len(h) for h in hyps) / timing.median,
                    "sentences_per_s": len(hyps) / timing.median,
                    "same_as_smallest_batch": same,
                    "same_as_shrinking": None if search == "shrinking" else
                    sum(a == b for a, b in zip(hyps, versus)) / len(hyps),
                }  # fmt: skip
                write_json(args.work / "parts" / "decode.partial.json", out)
    return out


def decode_timed(tr, options, groups: list, search: str, device: str):
    """Every line's best output ids, a group of ids at a time (the translator batches each
    as its search takes it), timed after a warm-up: the shortest and longest groups, or with
    CUDA graphs every group once (each shape's graph is then captured: steady state, as in a
    server that has seen its shapes)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else None
    warm = groups if search == "graphs" else groups[:2] + groups[-1:]
    for group in warm:
        tr.translate(group, options)
    timing, hyps = timed(
        lambda g=groups: [list(t.best.tokens) for group in g for t in tr.translate(group, options)],
        1, 0, sync,
    )  # fmt: skip
    return hyps, timing


def short_run(args, sizes: Sizes, name: str, steps: int) -> tuple[Path, list[str]]:
    """The run directory and overrides of a run of `steps` updates (`sizes.steps` in a smoke
    run) that validates once, by loss, at its end."""
    run = run_dir(args, sizes, name)
    steps = sizes.steps or steps
    items = [f"run_dir={run}", *sizes.data, *sizes.run, f"train.max_steps={steps}"]
    items += [f"train.log_every={2 if sizes.smoke else 10}", f"train.valid_every={steps}"]
    return run, items + ["train.bleu_every=0", "train.best_metric=loss"]


def part_fp16(args, sizes: Sizes) -> dict:
    run, items = short_run(args, sizes, "fp16", 50)
    items += ["train.precision=fp16"]
    checked(mtx("train", "--config", sizes.config, *sets(items), timeout=left(args, 150)))

    last = Checkpoint.load(RunDir(run).last)
    train = read_metrics(RunDir(run).metrics, "train")
    return {
        "steps": last.step,
        "losses": [r["loss"] for r in train],
        "skipped": sum(r["skipped"] for r in train),
        "loss_scale": (last.resume.scaler or {}).get("scale"),
    }


def part_nccl(args, sizes: Sizes) -> dict:
    run, items = short_run(args, sizes, "nccl", 30)
    env = os.environ | {"PYTHONUNBUFFERED": "1"}

    def job() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
             "-m", "mtx", "train", "--config", sizes.config, *sets(items)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=left(args, 180),
        )  # fmt: skip

    timing, proc = timed(job, 1, 0)
    checked(proc)
    last = Checkpoint.load(RunDir(run).last)
    joined = re.search(r"1 process\(es\), (\w+)", proc.stdout + proc.stderr)  # the model line
    return {"exit": proc.returncode, "backend": joined.group(1) if joined else None,
            "last_step": last.step, "seconds": timing.median}  # fmt: skip


def part_oom(args, sizes: Sizes) -> dict:
    """A real out-of-memory error in the third update's forward pass (on the CPU, where none
    can be provoked safely, torch's OutOfMemoryError is raised in its place)."""
    import torch

    from mtx.config import load_config
    from mtx.train import trainer as trainer_module

    run, items = short_run(args, sizes, "oom", 12)
    cfg = load_config(ROOT / sizes.config, items)
    calls = [0]

    def too_big(module, inputs):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == 3:
                if torch.cuda.is_available() and not sizes.smoke:
                    torch.empty(1 << 46, dtype=torch.uint8, device="cuda")  # 64 TiB
                raise torch.OutOfMemoryError("out of memory (simulated on the CPU)")

    real_init = trainer_module.Trainer.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        self.model.register_forward_pre_hook(too_big)

    trainer_module.Trainer.__init__ = init
    lines: list[str] = []
    trainer_module.train(cfg, overwrite=True, log=lines.append)
    return {
        "oom_records": read_metrics(RunDir(run).metrics, "oom"),
        "last_step": Checkpoint.load(RunDir(run).last).step,
        "real_cuda_oom": torch.cuda.is_available() and not sizes.smoke,
    }
