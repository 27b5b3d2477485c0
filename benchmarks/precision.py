"""How far each training precision's loss curve runs from fp32's, update by update.

    python -m benchmarks.precision [--updates 200] [--json]

The toy corpus, prepared into a temporary directory, and a tiny Transformer (d_model 32, one
layer a side, 512-token batches, warm-up 50) trained from the same initial weights on the
same batches with train.precision fp32, bf16 (autocast) and bf16-weights (train/master.py).
Reported for each against fp32: the largest relative difference of an update's loss, and
that of the last 50 updates' mean. tests/test_master.py asserts bounds on the same curves.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import datasets
import torch

from mtx.bench.harness import result
from mtx.config import load_config
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.data.prepare import prepare
from mtx.model.build import make_model
from mtx.train.step import build_step

TINY = [
    "model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.encoder_layers=1",
    "model.decoder_layers=1", "train.max_tokens=512", "train.device=cpu", "data.vocab_size=200",
]  # fmt: skip


def curve(prepared: Path, overrides: list[str], updates: int = 200):
    """Per-token losses of `updates` updates from seed 0 on the prepared data's batches, in
    order across epochs; and the trained model and its Step."""
    cfg = load_config(None, [*overrides, "train.warmup_steps=50"])
    ds = datasets.load_from_disk(str(prepared / "train"))
    torch.manual_seed(0)
    model = make_model(cfg.model, cfg.data.vocab_size)
    step = build_step(cfg, model, torch.device("cpu"))
    data, epoch = [], 0
    while len(data) < updates:
        order = token_batches(*lengths(ds), cfg.train.max_tokens, cfg.train.seed, epoch, 8)
        data += list(BatchDataset(ds, order, 8))
        epoch += 1
    losses = []
    for n in range(updates):
        out = step([data[n]], n + 1)
        losses.append(out.loss.item() / out.tgt_tokens)
    return losses, model, step


def deviation(losses: list[float], reference: list[float], tail: int = 50) -> dict:
    """The largest relative difference of one update's loss, and of the last `tail` updates'
    mean."""
    worst = max(abs(a - b) / b for a, b in zip(losses, reference))
    end = abs(sum(losses[-tail:]) - sum(reference[-tail:])) / sum(reference[-tail:])
    return {"worst_update": worst, "last_mean": end}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.precision", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        prepare(load_config(None, [f"run_dir={tmp}", *TINY]), log=lambda *_: None)
        prepared = Path(tmp) / "prepared"
        runs = {p: curve(prepared, [*TINY, f"train.precision={p}"], args.updates)[0]
                for p in ("fp32", "bf16", "bf16-weights")}  # fmt: skip
    rows = {p: deviation(runs[p], runs["fp32"]) for p in ("bf16", "bf16-weights")}
    rows["fp32"] = {"first_loss": runs["fp32"][0], "last_loss": runs["fp32"][-1]}
    if args.json:
        print(json.dumps(result("precision", rows, updates=args.updates)))
        return
    print(f"fp32: loss {runs['fp32'][0]:.2f} -> {runs['fp32'][-1]:.2f} over {args.updates} updates")
    for p in ("bf16", "bf16-weights"):
        r = rows[p]
        print(
            f"{p}: worst update {r['worst_update']:.1%}, last 50 updates' mean {r['last_mean']:.1%}"
        )


if __name__ == "__main__":
    main()
