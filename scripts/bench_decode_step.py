"""Time one decoder step of a checkpoint's model on the CPU, and its matrix products alone.

    python scripts/bench_decode_step.py --checkpoint RUN/checkpoints/best.pt \
        [--rows 1 4 16 32 128] [--cached 10] [--threads 2] [--repeat 200] [--compile]

For each number of rows (hypotheses decoded together), with `--cached` positions already in
the key/value cache:
- "products": the step's linear layers alone (each decoder layer's self-attention, cross-
  attention query, outputs and feed-forward layers, then the output projection), in order,
  on random inputs, three ways: F.linear with rows padded to 16 (model/rows.py), packed fp32
  and packed int8 (model/packed.py);
- "step": `model.decode` of one position, unpacked, packed fp32 and packed int8, and with
  --compile also torch.compile's (inductor, freezing, dynamic shapes) of the unpacked model.
Milliseconds per step, the median of 5 timings of --repeat steps each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mtx import checkpoint
from mtx.model.packed import PackedLinear
from mtx.model.rows import linear


def per_call_ms(f, repeat: int) -> float:
    for _ in range(10):
        f()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            f()
        times.append((time.perf_counter() - start) / repeat * 1e3)
    return statistics.median(times)


def step_products(model) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The (weight, bias) of every product of a decoding step after the first, in order."""
    out = []
    for layer in model.decoder_layers:
        for module, names in ((layer.self_attn, ("qkv", "out")), (layer.cross_attn, ("q", "out"))):
            out += [module.linear_layer(n)[:2] for n in names]
        out += [layer.ffn.linear_layer(n)[:2] for n in ("fc1", "fc2")]
    return out + [(model.embed.weight, None)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 128])
    ap.add_argument("--cached", type=int, default=10, help="positions already decoded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--compile", action="store_true", help="also torch.compile's step")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _, _ = checkpoint.load_model(args.checkpoint)
    model = model.float().eval()
    weights = step_products(model)
    products = {  # (function, input width) of each product, three ways
        "padded": [(lambda x, w=w, b=b: linear(x, w, b), w.size(1)) for w, b in weights],
        **{k: [(PackedLinear(w, b, k), w.size(1)) for w, b in weights] for k in ("fp32", "int8")},
    }
    compiled = None
    if args.compile:
        import torch._inductor.config as inductor

        inductor.freezing = True
        compiled = torch.compile(model.decode, dynamic=True)
    print(f"{args.threads} threads, {args.cached} positions cached; ms per step")
    print("| rows | products padded | products fp32 | products int8 | step unpacked | step fp32 "
          "| step int8 |" + (" step compiled |" if compiled else ""))  # fmt: skip
    print("|---" * (7 + bool(compiled)) + "|")
    for rows in args.rows:
        inputs = {w.size(1): torch.randn(rows, w.size(1)) for w, _ in weights}
        with torch.inference_mode():
            row = [
                per_call_ms(lambda fs=fs, xs=inputs: [f(xs[n]) for f, n in fs], 50)
                for fs in products.values()
            ]
            src = torch.randint(4, model.vocab_size, (rows, 14))
            for kind in (None, "fp32", "int8", "compiled"):
                if kind == "compiled" and compiled is None:
                    continue
                model.pack(None if kind == "compiled" else kind)
                memory, mask = model.encode(src)
                cache = model.new_cache()
                for _ in range(args.cached):
                    model.decode(torch.full((rows, 1), 5), memory, mask, cache)
                decode = compiled if kind == "compiled" else model.decode
                last = torch.full((rows, 1), 5)
                layers = [dict(c) for c in cache]

                def step(decode=decode, last=last, layers=layers, mask=mask):
                    return decode(last, None, mask, [dict(c) for c in layers])

                row.append(per_call_ms(step, args.repeat))
        print(f"| {rows} | " + " | ".join(f"{ms:.2f}" for ms in row) + " |", flush=True)


if __name__ == "__main__":
    main()
