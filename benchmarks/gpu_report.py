"""One command that turns a GPU's few minutes into mtx's GPU table.

    python -m benchmarks.gpu_report --data DIR --out OUT [--parts bench,profile,...]
        [--minutes 3] [--variants eager,compiled,...] [--train-variant eager] [--smoke]

DIR holds Multi30k's plain-text files (train.en, train.de, val.*, test2016.*, test2017.*; a
copy of data/multi30k, which does not travel to a lent GPU machine). The parts, in
this order (gpu_parts.py):

- prepare  `mtx prepare` of Multi30k (every other part reads it)
- bench    `mtx bench train` of configs/base.yaml and configs/big.yaml, bf16, 25k-token updates on
           WMT-like lengths (Multi30k pairs joined 2 to 4 at random, up to 250 subwords;
           random ids of a 37k vocabulary), in every training variant of --variants
           (gpu_parts.VARIANTS: eager, compiled, bf16 weights, compiled with static shapes
           and CUDA graphs, compiled with inductor's C++ wrapper, and combinations), each
           with its ratio to eager
- train    `mtx train --config configs/multi30k.yaml` for --minutes, its logged tokens/s
           beside `mtx bench train` of the same config, validation's share of the time, test2016 BLEU
- decode   the trained model on val + test2016 + test2017 (3,014 lines), bf16, beam 4 and
           greedy, batches of 32, 128 and 512 sentences, with each search (decode.search
           shrinking, static, and graphs on CUDA): target tokens/s, and how many outputs
           equal those of the same search at batches of 32, and those of the shrinking one
- fp16     50 updates with fp16 autocast and the loss scaler
- nccl     a one-process `torchrun` job (NCCL) that reaches its last checkpoint
- oom      a real CUDA out-of-memory error in one step: skipped, and training goes on
- profile  torch.profiler over base's steps, eager, compiled and with bf16 weights: top
           kernels, the kernels' time by kind, GPU busy time, compilations (with --trace the
           Chrome traces, to WORK/traces, which `python -m benchmarks.traces` reads)

Each part runs in a process of its own under a time limit, so a failure or an overrun costs
that part only, and every part's limit leaves the later parts the least they need within
--budget seconds (530: the report ends in under 9 minutes; a part that no longer fits says
so in the table). WORK/parts/NAME.json holds each part's figures as soon as it ends,
OUT/report.json all of them (rewritten after each part), and OUT/report.md the table (printed
last). `--smoke` runs every part on the CPU with tiny sizes and the toy corpus, in about a
minute (tests/test_gpu_report.py runs it), so that the report cannot rot between GPU
sessions. scripts/gpu_report.sh is the recipe of a GPU call around it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import gpu_parts
from mtx.bench.harness import commit, machine

PARTS = ("prepare", "bench", "train", "decode", "fp16", "nccl", "oom", "profile")
LIMITS = {"prepare": 150, "bench": 420, "profile": 240, "decode": 300, "fp16": 150}
LIMITS |= {"nccl": 180, "oom": 150}  # seconds a part may take at most (train: --minutes + 300)
LEAST = {"prepare": 20, "bench": 60, "profile": 45, "decode": 40, "fp16": 30, "nccl": 30}
LEAST |= {"oom": 30}  # seconds a part needs to be worth starting (train: --minutes + 60)


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="Multi30k's files (not needed with --smoke)")
    ap.add_argument("--out", type=Path, required=True, help="report.md and report.json go here")
    ap.add_argument("--work", type=Path, help="run directories and parts (default OUT/work)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset")
    ap.add_argument("--minutes", type=float, default=3.0, help="the train part's time bound")
    ap.add_argument(
        "--variants",
        default=",".join(gpu_parts.VARIANTS),
        help="the bench part's training variants, comma-separated (gpu_parts.VARIANTS)",
    )
    ap.add_argument(
        "--train-variant", default="eager", help="the train part's variant (gpu_parts.VARIANTS)"
    )
    ap.add_argument("--checkpoint", type=Path, help="the decode part's model (default: train's)")
    ap.add_argument("--batches", default="32,128,512", help="the decode part's batch sizes")
    ap.add_argument(
        "--trace", action="store_true", help="the profile part's Chrome traces to WORK/traces"
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, in seconds")
    ap.add_argument("--budget", type=float, default=530, help="seconds for all parts")
    ap.add_argument(
        "--limit", action="append", default=[], metavar="PART=SECONDS",
        help="a part's own time limit in place of LIMITS' (repeatable)",
    )  # fmt: skip
    ap.add_argument("--part", help=argparse.SUPPRESS)  # runs one part in this process
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # the part's, epoch s
    return ap.parse_args(argv)


# --- running the parts, and the table ---------------------------------------------------------


def run_part(args, name: str, limit: float) -> dict:
    """Part `name` in a child process within `limit` seconds; its figures or its error."""
    deadline = time.time() + limit - 5  # the child's own steps end before it is killed
    command = [sys.executable, "-m", "benchmarks.gpu_report", *args.argv, "--part", name]
    command += ["--deadline", str(deadline)]
    start = time.perf_counter()
    path = args.work / "parts" / f"{name}.json"
    partial = path.with_suffix(".partial.json")  # what a part wrote before it failed
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".log").write_text(proc.stdout + proc.stderr)  # TORCH_LOGS' lines too
        error = None if proc.returncode == 0 and path.is_file() else proc.stderr or proc.stdout
    except subprocess.TimeoutExpired:
        error = f"over its time limit of {limit:.0f} s"
    if error is None:
        return json.loads(path.read_text()) | {"part_seconds": time.perf_counter() - start}
    done = json.loads(partial.read_text()) if partial.is_file() else {}
    return done | {"error": error.strip()[-2000:]}


def limits(args, name: str, later: list[str], deadline: float) -> tuple[float, float]:
    """(the most, the least) seconds part `name` gets: its own limit, or what the deadline
    leaves after the least that the `later` parts need."""
    train = args.minutes * 60
    own = LIMITS | {k: float(v) for k, v in (x.split("=", 1) for x in args.limit)}
    most = own.get(name, train + 300)
    reserve = sum(LEAST.get(p, train + 60) for p in later)
    return min(most, deadline - time.time() - reserve), LEAST.get(name, train + 60)


def environment() -> dict:
    """The harness's machine and commit, and the GPU's memory."""
    import torch

    env = machine() | {"commit": commit()}
    if torch.cuda.is_available():
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return env


def entries(part: dict):
    """A part's figures per configuration (bench, profile, decode), without the bookkeeping."""
    return ((k, v) for k, v in part.items() if k not in ("part_seconds", "error"))


def agreement(losses: list[float], reference: list[float]) -> dict:
    """How closely a variant's per-update losses follow the reference's over the same batches
    from the same seed: the largest relative difference of one update's loss, and that of the
    mean over the last 20 updates."""
    rel = [abs(a - b) / abs(b) for a, b in zip(losses, reference)]
    last, ref = losses[-20:], reference[-20:]
    return {
        "updates": len(rel),
        "max_rel": max(rel),
        "last20_rel": abs(sum(last) - sum(ref)) / abs(sum(ref)),
    }


def reference_of(label: str) -> str:
    """The variant whose batches `label`'s are: static shapes' or eager's (itself for those)."""
    model, name = label.split(" ", 1)
    return f"{model} static" if "graphs" in name or name == "static" else f"{model} eager"


def bench_rows(part: dict):
    for label, r in entries(part):
        if "error" in r:
            yield f"bench {label}", "failed: " + r["error"][-200:].replace("\n", " ")
            continue
        mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") else ""
        mfu += f", {r['vs_eager']:.2f}x eager" if r.get("vs_eager") else ""
        ref = part.get(reference_of(label), {})
        if ref.get("losses") and r.get("losses") and ref is not r:
            a = agreement(r["losses"], ref["losses"])
            mfu += (
                f", loss vs {reference_of(label).split(' ', 1)[1]} over {a['updates']} updates: "
                f"max {a['max_rel']:.2%}, last 20 {a['last20_rel']:.2%}"
            )
        compiling = (
            f", compile {r['compile_seconds']:.0f} s, {r['timed_compilations']} compilations "
            "while timed" if r["compile"] else ""
        )  # fmt: skip
        yield (
            f"bench {label}",
            (
                f"{r['tokens_per_s']:,.0f} tokens/s ({r['tgt_tokens_per_s']:,.0f} target), "
                f"{r['tflops']:.1f} TFLOP/s{mfu}, {r['padding']:.1%} padding, "
                f"peak {r['peak_memory_bytes'] / 2**30:.1f} GiB{compiling}"
            ),
        )


def profile_rows(part: dict):
    for label, r in entries(part):
        busy = f", GPU busy {r['busy']:.0%}" if r["busy"] is not None else ""
        kinds = ", ".join(f"{k} {ms:.1f}" for k, ms in r["kinds_ms_per_update"].items())
        top = "; ".join(f"{t['name'][:40]} {t['ms_per_update']:.2f} ms" for t in r["top"][:5])
        yield (
            f"profile {label}",
            f"{r['wall_ms_per_update']:.1f} ms/update{busy}; by kind (ms): {kinds}; top: {top}",
        )


def decode_rows(part: dict):
    for label, r in entries(part):
        same = r["same_as_smallest_batch"]
        same = "" if same is None else f", {same:.1%} same as the smallest batch"
        if r.get("same_as_shrinking") is not None:
            same += f", {r['same_as_shrinking']:.1%} same as shrinking"
        yield (
            f"decode {label}",
            (
                f"{r['tgt_tokens_per_s']:,.0f} target tokens/s, "
                f"{r['sentences_per_s']:,.0f} sentences/s{same}"
            ),
        )


def train_rows(p: dict):
    t = p["test"]
    yield (
        "train (Multi30k)",
        (
            f"{p['steps']} steps in {p['wall_seconds']:.0f} s; logged "
            f"{p['logged_tokens_per_s']:,.0f} tokens/s vs bench {p['bench_tokens_per_s']:,.0f}; "
            f"validation {p['valid_seconds']:.0f} s (BLEU {p['bleu_seconds']:.0f} s); test2016 "
            f"BLEU {t['bleu']:.2f}, chrF {t['chrf']:.2f}"
        ),
    )


def other_rows(name: str, p: dict):
    if name == "prepare":
        yield "prepare Multi30k", f"{p['seconds']:.0f} s, vocabulary {p['vocab_size']}"
    elif name == "fp16":
        yield (
            "fp16 + loss scaler",
            (
                f"{p['steps']} updates, {p['skipped']} skipped, loss {p['losses'][0]:.2f} -> "
                f"{p['losses'][-1]:.2f}, scale {p['loss_scale']}"
            ),
        )
    elif name == "nccl":
        yield (
            f"torchrun, 1 process, {p['backend']}",
            (f"exit {p['exit']}, last checkpoint at step {p['last_step']}, {p['seconds']:.0f} s"),
        )
    elif name == "oom":
        real = " (real CUDA OOM)" if p["real_cuda_oom"] else ""
        yield (
            f"out of memory in one step{real}",
            (f"{len(p['oom_records'])} batch(es) skipped, training reached step {p['last_step']}"),
        )


ROWS = {"bench": bench_rows, "profile": profile_rows, "decode": decode_rows, "train": train_rows}


def table(report: dict) -> str:
    """The Markdown table of the figures that BENCHMARKS.md keeps."""
    lines = [f"environment: {json.dumps(report['environment'])}", "", "| what | figure |"]
    lines.append("|---|---|")
    for name, part in report["parts"].items():
        if "error" in part:
            failed = part["error"].replace("\n", " ")[-300:].replace("|", "/")
            lines.append(f"| {name} | failed: {failed} |")
            if name != "bench":  # a bench that ran out of time: the configurations it did
                continue
        rows = ROWS[name](part) if name in ROWS else other_rows(name, part)
        lines += [f"| {what} | {figure} |" for what, figure in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = arguments(argv)
    args.out = args.out.resolve()
    args.work = (args.work or args.out / "work").resolve()
    args.data = args.data.resolve() if args.data else None
    args.checkpoint = args.checkpoint.resolve() if args.checkpoint else None
    args.argv = [*(sys.argv[1:] if argv is None else argv), "--out", str(args.out)]
    args.argv += ["--work", str(args.work)] + (["--data", str(args.data)] if args.data else [])
    sizes = gpu_parts.Sizes(args)
    if args.part:  # the child process of run_part
        figures = getattr(gpu_parts, f"part_{args.part}")(args, sizes)
        gpu_parts.write_json(args.work / "parts" / f"{args.part}.json", figures)
        return
    if not args.smoke and (args.data is None or not (args.data / "train.en").is_file()):
        sys.exit(f"--data {args.data}: no Multi30k files (train.en, ...) there")
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        sys.exit(f"--parts: unknown {', '.join(unknown)}; parts: {', '.join(PARTS)}")
    variants = [*args.variants.split(","), args.train_variant]
    unknown = [v for v in variants if v not in gpu_parts.VARIANTS]
    if unknown:
        known = ", ".join(gpu_parts.VARIANTS)
        sys.exit(f"--variants/--train-variant: unknown {', '.join(unknown)}; variants: {known}")
    deadline = time.time() + args.budget
    report = {"environment": environment(), "parts": {}}
    for i, name in enumerate(parts):
        most, least = limits(args, name, parts[i + 1 :], deadline)
        if most < least:
            report["parts"][name] = {"error": f"skipped: {most:.0f} s of --budget left for it"}
            continue
        print(f"[gpu_report] {name} (at most {most:.0f} s) ...", flush=True)
        report["parts"][name] = run_part(args, name, most)
        gpu_parts.write_json(args.out / "report.json", report)
    text = table(report)
    (args.out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
