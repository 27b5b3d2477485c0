"""`mtx bench train`: training throughput, model FLOPs utilisation and peak memory of a config.

It times `steps` updates of the real training step (train/step.py's `build_step`, as the
trainer runs it: forward, loss, backward, gradient norm, fused Adam) after `warmup` updates,
`repeats` times (the harness's median), on batches of the run's prepared training data, or
with `synthetic` on random token ids whose lengths are spread around a given mean, or drawn
from a real corpus's pairs (`lengths_from`, a prepared split), optionally joined a few at a
time (`join`) for the longer sentences of WMT-like corpora. Batches are built before timing,
so the figure is the step's speed; in training, background workers build them while the
device computes. With `train.compile`, the warm-up compiles, and its seconds and the
compilations are reported.

Model FLOPs are counted from the architecture for each sentence pair's real lengths
(model/flops.py: matrix products, attention included, padding excluded), so MFU is the useful
fraction of the device's peak. Memory is the harness's measure (the process's peak PSS) on
the CPU, torch's peak allocated on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch

from mtx.bench.harness import PeakMemory, result, timed
from mtx.checkpoint import RunDir
from mtx.config import Config
from mtx.data.batching import Batch, BatchDataset, collate, lengths
from mtx.data.prepared import load_manifest, load_prepared
from mtx.device import pick_device
from mtx.errors import MtxError
from mtx.model.build import make_model
from mtx.model.flops import forward_flops
from mtx.model.transformer import count_parameters
from mtx.tokens import EOS_ID, PAD_ID
from mtx.train import compiled
from mtx.train.data import epoch_batches, fixed_tokens
from mtx.train.step import Step, build_step

# Dense bf16/fp16 tensor-core peak of one GPU in TFLOP/s, from the vendors' data sheets (no
# sparsity); the first name contained in torch.cuda.get_device_name() wins.
PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,
    "H200": 989.4,
    "H800": 989.4,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10G": 70.0,
    "V100": 125.0,
}


@dataclass
class Options:
    """What `mtx bench train` is asked for (its flags)."""

    steps: int = 20  # updates timed
    warmup: int = 5  # updates run before timing, cycling through the timed ones
    repeats: int = 1  # timed passes over the `steps` updates (the median counts)
    synthetic: bool = False  # random ids instead of the run's prepared data
    length: int = 30  # mean sentence length of synthetic batches
    peak_tflops: float | None = None  # the device's peak for MFU (default: PEAK_TFLOPS)
    lengths_from: str | None = None  # a prepared split whose pair lengths random ids take
    join: tuple[int, int] = (1, 1)  # with lengths_from: join N to M random pairs into one


def known_peak_tflops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda" or precision not in ("bf16", "fp16", "bf16-weights"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def joined_lengths(
    src_lens: np.ndarray, tgt_lens: np.ndarray, join: tuple[int, int], cap: int, n: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`n` (source, target) lengths of pairs made by joining join[0] to join[1] random pairs
    of the given lengths (each with its EOS: one EOS per joined pair), pairs longer than
    `cap` tokens on either side left out."""
    rng = np.random.default_rng(seed)
    src_out, tgt_out = [], []
    for _ in range(100 * n):  # draws: an impossible cap ends with an error, not a hang
        if len(src_out) == n:
            break
        k = int(rng.integers(join[0], join[1] + 1))
        rows = rng.integers(0, len(src_lens), k)
        s, t = int(src_lens[rows].sum()) - k + 1, int(tgt_lens[rows].sum()) - k + 1
        if s <= cap and t <= cap:
            src_out.append(s)
            tgt_out.append(t)
    if len(src_out) < n:
        raise MtxError(
            f"--join {join[0]}-{join[1]}: too few joined pairs fit {cap} tokens (data.max_len "
            "+ 1); join fewer pairs or raise data.max_len"
        )
    return np.array(src_out), np.array(tgt_out)


def synthetic_batches(
    cfg: Config,
    vocab_size: int,
    count: int,
    length: int,
    real_lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[Batch]:
    """`count` token-budget batches of random ids. Sentence lengths (EOS included) are
    uniform in [length / 2, 3 * length / 2], capped at data.max_len + 1, or `real_lengths`
    (source and target lengths of real pairs, in order)."""
    rng = np.random.default_rng(cfg.train.seed)
    if real_lengths is None:
        low, high = max(2, length // 2), min(cfg.data.max_len + 1, 3 * length // 2)
        n = int(count * cfg.train.max_tokens / max(low, 1)) + 1
        if cfg.train.static_shapes:  # enough pairs of each length to fill its batches
            n = max(n, 50_000)
        src_lens, tgt_lens = rng.integers(low, high + 1, n), rng.integers(low, high + 1, n)
    else:
        src_lens, tgt_lens = real_lengths

    def sentence(n: int) -> list[int]:
        return rng.integers(EOS_ID + 1, vocab_size, n - 1).tolist() + [EOS_ID]

    t = cfg.train
    order = epoch_batches(src_lens, tgt_lens, t, 0)
    order = [order[i % len(order)] for i in range(count)]
    return [
        collate(
            [sentence(src_lens[i]) for i in b],
            [sentence(tgt_lens[i]) for i in b],
            t.pad_to,
            fixed_tokens(t),
        )  # fmt: skip
        for b in order
    ]


def prepared_batches(cfg: Config, count: int) -> list[Batch]:
    """The first `count` batches of the first epoch's order (repeated if there are fewer)."""
    ds = load_prepared(cfg, "train")
    t = cfg.train
    order = epoch_batches(*lengths(ds), t, 0)
    order = [order[i % len(order)] for i in range(count)]
    return list(BatchDataset(ds, order, t.pad_to, fixed_tokens(t)))


def batch_flops(batch: Batch, cfg: Config, vocab_size: int) -> int:
    """Training FLOPs of a batch: 3x the forward FLOPs of each pair at its real lengths."""
    src_lens = (batch.src != PAD_ID).sum(1).tolist()
    tgt_lens = (batch.tgt_out != PAD_ID).sum(1).tolist()
    return sum(3 * forward_flops(cfg.model, vocab_size, s, t) for s, t in zip(src_lens, tgt_lens))


def bench_batches(cfg: Config, count: int, o: Options) -> tuple[list[Batch], int, str]:
    """`count` batches to time, the vocabulary size, and what the data is (for the report):
    the run's prepared training data, or random ids with `synthetic` lengths or the lengths of
    the pairs of `lengths_from` (a prepared split), joined join[0] to join[1] at a time."""
    if not (o.synthetic or o.lengths_from):
        batches = prepared_batches(cfg, count)  # a clear error where there is no such data
        return batches, load_manifest(cfg).vocab_size, str(RunDir.of(cfg).prepared)
    real, data = None, f"synthetic, mean length {o.length}"
    if o.lengths_from:
        if not (Path(o.lengths_from) / "dataset_info.json").is_file():
            raise MtxError(f"--lengths-from {o.lengths_from}: not a prepared split directory")
        src_lens, tgt_lens = lengths(datasets.load_from_disk(o.lengths_from))
        n = 200_000 if o.join != (1, 1) else len(src_lens)
        cap = cfg.data.max_len + 1
        real = joined_lengths(src_lens, tgt_lens, o.join, cap, n, cfg.train.seed)
        data = f"random ids, lengths of {o.lengths_from}"
        data += f" joined {o.join[0]} to {o.join[1]} at a time" if o.join != (1, 1) else ""
    vocab_size = cfg.data.vocab_size
    return synthetic_batches(cfg, vocab_size, count, o.length, real), vocab_size, data


def bench(cfg: Config, options: Options | None = None) -> dict:
    """Time `steps` training updates of `cfg` after `warmup`, `repeats` times; the figures."""
    o = options or Options()
    t = cfg.train
    device = pick_device(t.device)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    U = t.update_freq
    batches, vocab_size, data = bench_batches(cfg, o.steps * U, o)
    torch.manual_seed(t.seed)
    step = build_step(cfg, make_model(cfg.model, vocab_size).to(device), device)
    updates = [batches[i * U : (i + 1) * U] for i in range(o.steps)]
    with PeakMemory() as host:
        timing, warmup_seconds, compiles, losses = timed_updates(step, updates, o.warmup, o.repeats)
    timed_batches = [b for group in updates for b in group]
    figures = speed(cfg, timed_batches, o, vocab_size, timing.median, step)
    return (
        figures
        | memory_figures(device, host)
        | {
            "compile": step.module.is_compiled,
            "data": data,
            "parameters": count_parameters(step.model),
            "steps": o.steps,
            "timing": timing.as_dict(),
            "warmup_seconds": warmup_seconds,
            "compile_seconds": compiles["compile_seconds"],
            "compilations": compiles["compilations"],
            "timed_compilations": compiles["timed_compilations"],
            "losses": losses,
        }
    )


def timed_updates(step: Step, updates: list[list[Batch]], warmup: int, repeats: int):
    """(the timing of `repeats` passes over `updates`, the warm-up's seconds, what was
    compiled, each update's loss per target token). The warm-up runs `warmup` updates cycling through the timed ones, so that work
    done once per new batch shape (attention plans, compiled graphs) is over before the clock
    starts, as it is within minutes of real training, where the same shapes come back every
    epoch. Updates are numbered on from 1 (the schedule's step), warm-up included. The losses
    (of every update, warm-up included: two variants' runs over the same batches from the same
    seed can be compared) are copied on the device and read once the clock has stopped."""
    device = step.precision.device
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    number = [0]
    losses: list[tuple[torch.Tensor, int]] = []

    def run(groups: list[list[Batch]]) -> None:
        for group in groups:
            number[0] += 1
            stats = step(group, number[0])
            losses.append((stats.loss.detach().clone(), stats.tgt_tokens))  # a graph's output

    warm = [updates[i % len(updates)] for i in range(warmup)]
    warm_timing, _ = timed(lambda: run(warm), repeats=1, warmup=0, sync=sync)
    before = compiled.stats()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timing, _ = timed(lambda: run(updates), repeats=repeats, warmup=0, sync=sync)
    after = compiled.stats()
    compiles = {
        "compile_seconds": after.seconds,
        "compilations": after.compilations,
        "timed_compilations": after.compilations - before.compilations,
    }
    per_token = [float(loss) / max(tokens, 1) for loss, tokens in losses]
    return timing, warm_timing.median, compiles, per_token


def speed(cfg: Config, timed_batches: list[Batch], o: Options, vocab_size: int, seconds: float,
          step: Step) -> dict:  # fmt: skip
    """Speed, FLOPs, MFU and padding of the timed batches, one pass of which took `seconds`."""
    src = sum(b.src_tokens for b in timed_batches)
    tgt = sum(b.tgt_tokens for b in timed_batches)
    padded = sum(b.padded_tokens for b in timed_batches)
    flops = sum(batch_flops(b, cfg, vocab_size) for b in timed_batches)
    device, precision = step.precision.device, step.precision.name
    peak = o.peak_tflops or known_peak_tflops(device, precision)
    tflops = flops / seconds / 1e12
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision,
        "tokens_per_update": (src + tgt) / o.steps,
        "padding": 1 - (src + tgt) / padded,
        "shapes": len({(*b.src.shape, b.tgt_out.size(1)) for b in timed_batches}),
        "seconds": seconds,
        "tokens_per_s": (src + tgt) / seconds,
        "tgt_tokens_per_s": tgt / seconds,
        "flops_per_token": flops / (src + tgt),
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak else None,
    }


def memory_figures(device: torch.device, host: PeakMemory) -> dict:
    """The peak memory: the GPU's (torch's peak allocated) or the process's (peak PSS)."""
    if device.type == "cuda":
        bytes_, kind = torch.cuda.max_memory_allocated(device), "cuda max allocated"
    else:
        bytes_, kind = host.peak.pss, "process peak PSS"
    return {"peak_memory_bytes": bytes_, "peak_memory_kind": kind}


def format_table(r: dict) -> str:
    mfu = f"{r['mfu']:.1%} of {r['peak_tflops']:g}" if r["mfu"] is not None else "n/a (no peak)"
    t = r["timing"]
    spread = f", median of {t['repeats']} (spread {t['spread']:.1%})" if t["repeats"] > 1 else ""
    rows = [
        ("device", f"{r['device']}, {r['precision']}" + (", compiled" if r["compile"] else "")),
        ("data", r["data"]),
        ("parameters", f"{r['parameters']:,}"),
        ("timed updates", f"{r['steps']} in {r['seconds']:.2f} s{spread}"),
        (
            "tokens per update",
            f"{r['tokens_per_update']:,.0f} (src + tgt), {r['padding']:.1%} padding",
        ),
        ("tokens/s", f"{r['tokens_per_s']:,.0f} (src + tgt), {r['tgt_tokens_per_s']:,.0f} target"),
        ("FLOPs per token", f"{r['flops_per_token'] / 1e6:,.1f}M (training, model FLOPs)"),
        ("achieved", f"{r['tflops']:.3f} TFLOP/s"),
        ("MFU", mfu),
        ("peak memory", f"{r['peak_memory_bytes'] / 2**30:.2f} GiB ({r['peak_memory_kind']})"),
        ("batch shapes", f"{r['shapes']} distinct in the timed updates"),
    ]
    if r["compile"]:
        compiling = f"{r['compile_seconds']:.1f} s, {r['compilations']} compilation(s), "
        rows.append(("compiling", compiling + f"{r['timed_compilations']} while timed"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(cfg: Config, options: Options, as_json: bool) -> str:
    """`mtx bench train`'s output: the table, or the harness's JSON result (one line)."""
    figures = bench(cfg, options)
    if not as_json:
        return format_table(figures)
    settings = {"config": cfg.to_dict(), **dataclasses.asdict(options)}
    return json.dumps(result("train", figures, **settings))
