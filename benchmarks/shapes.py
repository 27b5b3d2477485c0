"""How many batch shapes an epoch makes and how much padding, with bounded and fixed shapes.

    python -m benchmarks.shapes --prepared RUN/prepared/train [--max-tokens 4096]
        [--wmt-tokens 12500] [--epochs 3]

For a prepared training split (Multi30k's, say) and for a WMT-like length distribution made
from it (its pairs joined 2 to 4 at random, up to 250 subwords, 200,000 pairs: `mtx bench
train --join`), one row per batching: `token_batches` with exact lengths (train.pad_to 1) and
with the default bounded lengths (pad_to 8), and `fixed_batches` (train.static_shapes: one
shape per length). Each row: batches per epoch, distinct (sentences, source length, target
length) shapes in one epoch and over all epochs, and the padding share of all tokens, the
empty pairs that fill a static-shape batch included.
"""

from __future__ import annotations

import argparse

import datasets
import numpy as np

from mtx.bench.train import joined_lengths
from mtx.data.batching import bucket_length, fixed_batches, fixed_rows, lengths, token_batches


def shape(src: np.ndarray, tgt: np.ndarray, b: np.ndarray, pad_to: int, fixed: int):
    """The (rows, source length, target length) a batch is collated to (data/batching.py)."""
    S, T = bucket_length(int(src[b].max()), pad_to), bucket_length(int(tgt[b].max()), pad_to)
    if not fixed:
        return len(b), S, T
    L = max(S, T)
    return fixed_rows(L, fixed), L, L


def shapes(src, tgt, max_tokens: int, pad_to: int, static: bool, epochs: int) -> dict:
    seen, first, real, padded, count = set(), set(), 0, 0, 0
    make = fixed_batches if static else token_batches
    for epoch in range(epochs):
        for b in make(src, tgt, max_tokens, 1, epoch, pad_to):
            rows, S, T = shape(src, tgt, b, pad_to, max_tokens if static else 0)
            seen.add((rows, S, T))
            if epoch == 0:
                first.add((rows, S, T))
                real += int(src[b].sum() + tgt[b].sum())
                padded += rows * (S + T)
                count += 1
    return {
        "batches": count,
        "shapes": len(first),
        "shapes_all_epochs": len(seen),
        "padding": 1 - real / padded,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepared", required=True, help="a prepared split (RUN/prepared/train)")
    ap.add_argument("--max-tokens", type=int, default=4096, help="train.max_tokens, the corpus")
    ap.add_argument("--wmt-tokens", type=int, default=12500, help="train.max_tokens, WMT-like")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    src, tgt = lengths(datasets.load_from_disk(args.prepared))
    wmt = joined_lengths(src, tgt, (2, 4), 251, 200_000, seed=1)
    print(f"| corpus | batching | batches per epoch | distinct shapes, 1 epoch ({args.epochs} "
          "epochs) | padding |")  # fmt: skip
    print("|---|---|---|---|---|")
    corpora = [
        (f"{args.prepared} ({len(src):,} pairs, max_tokens {args.max_tokens})", (src, tgt),
         args.max_tokens),
        (f"WMT-like (200,000 pairs, max_tokens {args.wmt_tokens})", wmt, args.wmt_tokens),
    ]  # fmt: skip
    kinds = [("exact lengths (pad_to 1)", 1, False), ("bounded (pad_to 8)", 8, False)]
    kinds += [("static shapes (pad_to 8)", 8, True)]
    for name, (s, t), max_tokens in corpora:
        for label, pad_to, static in kinds:
            r = shapes(s, t, max_tokens, pad_to, static, args.epochs)
            print(
                f"| {name} | {label} | {r['batches']} | {r['shapes']} ({r['shapes_all_epochs']})"
                f" | {r['padding']:.1%} |"
            )


if __name__ == "__main__":
    main()
