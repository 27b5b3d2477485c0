"""`mtx bench`: training throughput, model FLOPs utilisation and peak memory of a config.

It times `steps` updates of the real training step (`train_step`: forward, loss, backward,
gradient norm, fused Adam) after `warmup` updates, on batches of the run's prepared training
data, or with `synthetic` on random token ids whose lengths are spread around a given mean
(for a config whose corpus is not at hand). Batches are built before timing, so the figure is
the step's speed; in training, background workers build them while the device computes.

Model FLOPs are counted from the architecture for each sentence pair's real lengths (flops.py:
matrix products, attention included, padding excluded), so MFU is the useful fraction of the
device's peak.
"""

from __future__ import annotations

import json
import resource
import time

import numpy as np
import torch

from mtx.config import Config
from mtx.data.batching import BatchDataset, collate, lengths, token_batches
from mtx.data.prepare import load_prepared, prepared_dir
from mtx.device import pick_device
from mtx.model.build import make_model
from mtx.model.flops import forward_flops
from mtx.model.transformer import count_parameters
from mtx.tokens import EOS_ID, PAD_ID
from mtx.train.step import Precision, make_optimizer, train_step

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


def synthetic_batches(cfg: Config, vocab_size: int, count: int, length: int) -> list[dict]:
    """`count` token-budget batches of random ids, sentence lengths uniform in
    [length / 2, 3 * length / 2] (EOS included), capped at data.max_len + 1."""
    rng = np.random.default_rng(cfg.train.seed)
    low, high = max(2, length // 2), min(cfg.data.max_len + 1, 3 * length // 2)
    n = int(count * cfg.train.max_tokens / max(low, 1)) + 1
    src_lens, tgt_lens = rng.integers(low, high + 1, n), rng.integers(low, high + 1, n)

    def sentence(n: int) -> list[int]:
        return rng.integers(EOS_ID + 1, vocab_size, n - 1).tolist() + [EOS_ID]

    order = token_batches(src_lens, tgt_lens, cfg.train.max_tokens, cfg.train.seed)
    order = [order[i % len(order)] for i in range(count)]
    return [
        collate([sentence(src_lens[i]) for i in b], [sentence(tgt_lens[i]) for i in b])
        for b in order
    ]


def prepared_batches(cfg: Config, count: int) -> list[dict]:
    """The first `count` batches of the first epoch's order (repeated if there are fewer)."""
    ds = load_prepared(cfg, "train")
    order = token_batches(*lengths(ds), cfg.train.max_tokens, cfg.train.seed)
    order = [order[i % len(order)] for i in range(count)]
    return list(BatchDataset(ds, order))


def batch_flops(batch: dict, cfg: Config, vocab_size: int) -> int:
    """Training FLOPs of a batch: 3x the forward FLOPs of each pair at its real lengths."""
    src_lens = (batch["src"] != PAD_ID).sum(1).tolist()
    tgt_lens = (batch["tgt_out"] != PAD_ID).sum(1).tolist()
    return sum(3 * forward_flops(cfg.model, vocab_size, s, t) for s, t in zip(src_lens, tgt_lens))


def bench(
    cfg: Config,
    steps: int = 20,
    warmup: int = 5,
    synthetic: bool = False,
    length: int = 30,
    peak_tflops: float | None = None,
) -> dict:
    """Time `steps` training updates of `cfg` after `warmup`; returns the figures."""
    device = pick_device(cfg.train.device)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    precision = Precision.choose(device, cfg.train.precision)
    U = cfg.train.update_freq
    if synthetic:
        vocab_size = cfg.data.vocab_size
        batches = synthetic_batches(cfg, vocab_size, steps * U, length)
    else:
        batches = prepared_batches(cfg, steps * U)
        manifest = json.loads((prepared_dir(cfg) / "manifest.json").read_text())
        vocab_size = manifest["vocab_size"]
    torch.manual_seed(cfg.train.seed)
    model = make_model(cfg.model, vocab_size).to(device)
    optimizer = make_optimizer(model, cfg)
    step_model = torch.compile(model, dynamic=True) if cfg.train.compile else model
    updates = [batches[i * U : (i + 1) * U] for i in range(steps)]

    def run(group: list[dict], step: int) -> None:
        train_step(step_model, optimizer, group, cfg, step, precision)

    # The warm-up cycles through the timed updates themselves, so that work done once per new
    # batch shape (cuDNN attention plans, compiled graphs) is over before the clock starts, as
    # it is within minutes of real training, where the same shapes come back every epoch.
    for i in range(warmup):
        run(updates[i % steps], i + 1)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for i, group in enumerate(updates):
        run(group, warmup + i + 1)
    synchronize(device)
    seconds = time.perf_counter() - start

    timed = [b for group in updates for b in group]
    src = sum(int((b["src"] != PAD_ID).sum()) for b in timed)
    tgt = sum(len(b["tgt_index"]) for b in timed)
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
        "compile": cfg.train.compile,
        "data": f"synthetic, mean length {length}" if synthetic else str(prepared_dir(cfg)),
        "parameters": count_parameters(model),
        "steps": steps,
        "tokens_per_update": (src + tgt) / steps,
        "padding": 1 - (src + tgt) / padded,
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
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
