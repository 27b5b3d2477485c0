"""Time one Adam step over a config's model: torch's foreach Adam against the fused Adam mtx uses.

    python scripts/bench_adam.py configs/toy.yaml [--vocab 400] [--steps 50]

The fused step also takes `found_inf`, which is how mtx skips a non-finite update on the
device; this shows what that choice costs or saves per step on the machine at hand.
"""

from __future__ import annotations

import argparse
import time

import torch

from mtx.config import load_config
from mtx.model.transformer import Transformer


def time_step(model: torch.nn.Module, fused: bool, steps: int) -> float:
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused
    )
    for _ in range(5):  # allocate the moments
        optimizer.step()
    start = time.perf_counter()
    for _ in range(steps):
        if fused:
            optimizer.found_inf = torch.zeros(())
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--vocab", type=int, default=400)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Transformer(load_config(args.config).model, args.vocab)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params:,} parameters, {torch.get_num_threads()} threads")
    for fused in (False, True):
        ms = time_step(model, fused, args.steps) * 1e3
        print(f"{'fused' if fused else 'foreach'} Adam step: {ms:.2f} ms")


if __name__ == "__main__":
    main()
