"""`mtx bench`: training throughput, model FLOPs utilisation and peak memory of a config.

It times `steps` updates of the real training step (`train_step`: forward, loss, backward,
gradient norm, fused Adam) after `warmup` updates, on batches of the run's prepared training
data, or with `synthetic` on random token ids (for a config whose corpus is not at hand) whose
lengths are spread around a given mean, or drawn from a real corpus's pairs (`lengths_from`, a
prepared split), optionally joined a few at a time (`join`) for the longer sentences of WMT-
like corpora. Batches are built before timing, so the figure is the step's speed; in
training, background workers build them while the device computes. With `train.compile`,
the warm-up compiles, and its seconds and the compilations are reported.

Model FLOPs are counted from the architecture for each sentence pair's real lengths (flops.py:
matrix products, attention included, padding excluded), so MFU is the useful fraction of the
device's peak.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import datasets
import numpy as np
import torch

from mtx.config import Config
from mtx.data.batching import BatchDataset, collate, lengths, token_batches
from mtx.data.prepare import load_prepared, prepared_dir
from mtx.device import pick_device
from mtx.errors import MtxError
from mtx.model.build import make_model
from mtx.model.flops import forward_flops
from mtx.model.transformer import count_parameters
from mtx.tokens import EOS_ID, PAD_ID
from mtx.train import compiled
from mtx.train.step import LossModel, Precision, make_optimizer, train_step

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


def known_peak_tflops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
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
) -> list[dict]:
    """`count` token-budget batches of random ids. Sentence lengths (EOS included) are
    uniform in [length / 2, 3 * length / 2], capped at data.max_len + 1, or `real_lengths`
    (source and target lengths of real pairs, in order)."""
    rng = np.random.default_rng(cfg.train.seed)
    if real_lengths is None:
        low, high = max(2, length // 2), min(cfg.data.max_len + 1, 3 * length // 2)
        n = int(count * cfg.train.max_tokens / max(low, 1)) + 1
        src_lens, tgt_lens = rng.integers(low, high + 1, n), rng.integers(low, high + 1, n)
    else:
        src_lens, tgt_lens = real_lengths

    def sentence(n: int) -> list[int]:
        return rng.integers(EOS_ID + 1, vocab_size, n - 1).tolist() + [EOS_ID]

    t = cfg.train
    order = token_batches(src_lens, tgt_lens, t.max_tokens, t.seed, pad_to=t.pad_to)
    order = [order[i % len(order)] for i in range(count)]
    return [
        collate([sentence(src_lens[i]) for i in b], [sentence(tgt_lens[i]) for i in b], t.pad_to)
        for b in order
    ]


def prepared_batches(cfg: Config, count: int) -> list[dict]:
    """The first `count` batches of the first epoch's order (repeated if there are fewer)."""
    ds = load_prepared(cfg, "train")
    t = cfg.train
    order = token_batches(*lengths(ds), t.max_tokens, t.seed, pad_to=t.pad_to)
    order = [order[i % len(order)] for i in range(count)]
    return list(BatchDataset(ds, order, t.pad_to))


def batch_flops(batch: dict, cfg: Config, vocab_size: int) -> int:
    """Training FLOPs of a batch: 3x the forward FLOPs of each pair at its real lengths."""
    src_lens = (batch["src"] != PAD_ID).sum(1).tolist()
    tgt_lens = (batch["tgt_out"] != PAD_ID).sum(1).tolist()
    return sum(3 * forward_flops(cfg.model, vocab_size, s, t) for s, t in zip(src_lens, tgt_lens))


def bench_batches(
    cfg: Config, count: int, synthetic: bool, length: int, lengths_from: str | None, join
) -> tuple[list[dict], int, str]:
    """`count` batches to time, the vocabulary size, and what the data is (for the report):
    the run's prepared training data, or random ids with `synthetic` lengths or the lengths of
    the pairs of `lengths_from` (a prepared split), joined join[0] to join[1] at a time."""
    if not (synthetic or lengths_from):
        batches = prepared_batches(cfg, count)  # a clear error where there is no such data
        manifest = json.loads((prepared_dir(cfg) / "manifest.json").read_text())
        return batches, manifest["vocab_size"], str(prepared_dir(cfg))
    real, data = None, f"synthetic, mean length {length}"
    if lengths_from:
        if not (Path(lengths_from) / "dataset_info.json").is_file():
            raise MtxError(f"--lengths-from {lengths_from}: not a prepared split directory")
        src_lens, tgt_lens = lengths(datasets.load_from_disk(lengths_from))
        n = 200_000 if join != (1, 1) else len(src_lens)
        real = joined_lengths(src_lens, tgt_lens, join, cfg.data.max_len + 1, n, cfg.train.seed)
        data = f"random ids, lengths of {lengths_from}"
        data += f" joined {join[0]} to {join[1]} at a time" if join != (1, 1) else ""
    vocab_size = cfg.data.vocab_size
    return synthetic_batches(cfg, vocab_size, count, length, real), vocab_size, data


def bench(
    cfg: Config,
    steps: int = 20,
    warmup: int = 5,
    synthetic: bool = False,
    length: int = 30,
    peak_tflops: float | None = None,
    lengths_from: str | None = None,
    join: tuple[int, int] = (1, 1),
) -> dict:
    """Time `steps` training updates of `cfg` after `warmup`; returns the figures.
    `lengths_from` (a prepared split directory) gives synthetic batches real lengths."""
    t = cfg.train
    device = pick_device(t.device)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    precision = Precision.choose(device, t.precision)
    U = t.update_freq
    batches, vocab_size, data = bench_batches(cfg, steps * U, synthetic, length, lengths_from, join)
    torch.manual_seed(t.seed)
    model = make_model(cfg.model, vocab_size).to(device)
    optimizer = make_optimizer(model, cfg)
    loss_model = LossModel(model, t.label_smoothing)
    enabled = compiled.wanted(t.compile, device)
    step_module = compiled.StepModule(loss_model, enabled, print, t.compile_backend, t.compile_mode)
    updates = [batches[i * U : (i + 1) * U] for i in range(steps)]

    def run(group: list[dict], step: int) -> None:
        step_module.run(lambda m: train_step(m, optimizer, group, cfg, step, precision), optimizer)

    # The warm-up cycles through the timed updates themselves, so that work done once per new
    # batch shape (cuDNN attention plans, compiled graphs) is over before the clock starts, as
    # it is within minutes of real training, where the same shapes come back every epoch.
    start = time.perf_counter()
    for i in range(warmup):
        run(updates[i % steps], i + 1)
    synchronize(device)
    warmup_seconds = time.perf_counter() - start
    before = compiled.stats()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for i, group in enumerate(updates):
        run(group, warmup + i + 1)
    synchronize(device)
    seconds = time.perf_counter() - start
    after = compiled.stats()
    timed = [b for group in updates for b in group]
    return figures(cfg, timed, steps, vocab_size, seconds, device, precision, peak_tflops) | {
        "compile": step_module.is_compiled,
        "data": data,
        "parameters": count_parameters(model),
        "steps": steps,
        "warmup_seconds": warmup_seconds,
        "compile_seconds": after["compile_seconds"],
        "compilations": after["compilations"],
        "timed_compilations": after["compilations"] - before["compilations"],
    }


def figures(cfg, timed, steps, vocab_size, seconds, device, precision, peak_tflops) -> dict:
    """Speed, FLOPs, MFU, padding and peak memory of the `timed` batches in `seconds`."""
    src = sum(b["src_tokens"] for b in timed)
    tgt = sum(b["tgt_tokens"] for b in timed)
    padded = sum(b["src"].numel() + b["tgt_out"].numel() for b in timed)
    flops = sum(batch_flops(b, cfg, vocab_size) for b in timed)
    peak = peak_tflops or known_peak_tflops(device, precision.name)
    tflops = flops / seconds / 1e12
    if device.type == "cuda":
        memory, memory_kind = torch.cuda.max_memory_allocated(device), "cuda max allocated"
    else:  # Linux reports the peak resident set size in KiB
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        memory_kind = "process peak RSS"
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision.name,
        "tokens_per_update": (src + tgt) / steps,
        "padding": 1 - (src + tgt) / padded,
        "shapes": len({(*b["src"].shape, b["tgt_out"].size(1)) for b in timed}),
        "seconds": seconds,
        "tokens_per_s": (src + tgt) / seconds,
        "tgt_tokens_per_s": tgt / seconds,
        "flops_per_token": flops / (src + tgt),
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak else None,
        "peak_memory_bytes": memory,
        "peak_memory_kind": memory_kind,
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_table(result: dict) -> str:
    r = result
    mfu = f"{r['mfu']:.1%} of {r['peak_tflops']:g}" if r["mfu"] is not None else "n/a (no peak)"
    rows = [
        ("device", f"{r['device']}, {r['precision']}" + (", compiled" if r["compile"] else "")),
        ("data", r["data"]),
        ("parameters", f"{r['parameters']:,}"),
        ("timed updates", f"{r['steps']} in {r['seconds']:.2f} s"),
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
        rows.append(
            (
                "compiling",
                f"{r['compile_seconds']:.1f} s, {r['compilations']} compilation(s), "
                f"{r['timed_compilations']} while timed",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
