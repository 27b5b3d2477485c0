"""How many batch shapes an epoch makes, and how much padding, with exact and bounded lengths.

    python scripts/batch_shapes.py --prepared RUN/prepared/train [--max-tokens 4096]
        [--wmt-tokens 12500] [--epochs 3]

For a prepared training split (Multi30k's, say) and for a WMT-like length distribution made
from it (its pairs joined 2 to 4 at random, up to 250 subwords, 200,000 pairs: mtx bench's
`--join`), one row per `train.pad_to` (1: exact lengths; 8: the default buckets of
data/batching.py): batches per epoch, distinct (sentences, source length, target length)
shapes in an epoch and over several epochs, distinct lengths, the padding share of all
tokens, and the batches' padded tokens against `train.max_tokens` (per side, the larger).
"""

from __future__ import annotations

import argparse

import datasets
import numpy as np

from mtx.bench import joined_lengths
from mtx.data.batching import bucket_length, lengths, token_batches


def shapes(src: np.ndarray, tgt: np.ndarray, max_tokens: int, pad_to: int, epochs: int) -> dict:
    seen, first, real, padded, fill, count = set(), None, 0, 0, [], 0
    for epoch in range(epochs):
        for b in token_batches(src, tgt, max_tokens, 1, epoch, pad_to):
            S, T = (
                bucket_length(int(src[b].max()), pad_to),
                bucket_length(int(tgt[b].max()), pad_to),
            )
            seen.add((len(b), S, T))
            if epoch == 0:
                real += int(src[b].sum() + tgt[b].sum())
                padded += len(b) * (S + T)
                fill.append(len(b) * max(S, T) / max_tokens)
                count += 1
        if epoch == 0:
            first = set(seen)
    return {
        "pad_to": pad_to,
        "batches": count,
        "shapes": len(first),
        "shapes_all_epochs": len(seen),
        "lengths": len({x for _, S, T in seen for x in (S, T)}),
        "padding": 1 - real / padded,
        "fill_mean": float(np.mean(fill)),
        "fill_min": float(np.min(fill)),
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
    print("| corpus | train.pad_to | batches per epoch | distinct shapes, 1 epoch "
          f"({args.epochs} epochs) | distinct lengths | padding | padded tokens / "
          "max_tokens: mean (min) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    corpora = [
        (f"{args.prepared}", (src, tgt), args.max_tokens),
        ("WMT-like", wmt, args.wmt_tokens),
    ]
    for name, (s, t), max_tokens in corpora:
        for pad_to in (1, 8):
            r = shapes(s, t, max_tokens, pad_to, args.epochs)
            print(
                f"| {name} ({len(s):,} pairs, max_tokens {max_tokens}) | {pad_to} | {r['batches']} "
                f"| {r['shapes']} ({r['shapes_all_epochs']}) | {r['lengths']} "
                f"| {r['padding']:.1%} | {r['fill_mean']:.1%} ({r['fill_min']:.1%}) |"
            )


if __name__ == "__main__":
    main()
