"""Peak memory and time of the output projection and label-smoothed loss, whole against chunked.

    python scripts/loss_memory.py [--tokens 12500] [--vocab 37000] [--d-model 512]
        [--dtype fp32|bf16] [--repeat 3]

For N target tokens of the base model (the decoder's output states, N x d_model) and the
shared embedding (V x d_model): `whole` is the projection to the (N, V) logits and
train/loss.py's label_smoothed_nll on them, as the eager step computed it before; `chunked` is
output_loss, which never holds more than one chunk of logits. Forward and backward, each in
a fresh process (peak RSS above the process's level just before: Linux's ru_maxrss), CPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def measure(args) -> dict:
    import torch

    from mtx.model.rows import linear
    from mtx.train.loss import label_smoothed_nll, output_loss

    torch.manual_seed(0)
    hidden = torch.randn(args.tokens, args.d_model, requires_grad=True)
    weight = (torch.randn(args.vocab, args.d_model) * args.d_model**-0.5).requires_grad_()
    target = torch.randint(4, args.vocab, (args.tokens,))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def run():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            if args.worker == "whole":
                loss, _ = label_smoothed_nll(linear(hidden, weight), target, 0.1, 0)
            else:
                loss, _ = output_loss(hidden, weight, target, 0.1, 0)
        loss.backward()
        hidden.grad = weight.grad = None
        return loss.item()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        value = run()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"loss": value, "peak_bytes": peak - before, "seconds": min(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=12500)
    ap.add_argument("--vocab", type=int, default=37000)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args)))
        return
    print(f"{args.tokens:,} target tokens, vocabulary {args.vocab:,}, d_model {args.d_model}, "
          f"{args.dtype}, CPU, forward + backward")  # fmt: skip
    print("| loss | peak memory above the start | seconds (best of "
          f"{args.repeat}) | loss value |")  # fmt: skip
    print("|---|---|---|---|")
    for worker in ("whole", "chunked"):
        out = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--worker", worker],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        r = json.loads(out.stdout.splitlines()[-1])
        print(f"| {worker} | {r['peak_bytes'] / 2**30:.2f} GiB | {r['seconds']:.2f} | "
              f"{r['loss']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
