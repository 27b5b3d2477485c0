"""Training speed of mtx against a plain `torch.nn.Transformer` model, side by side in one run.

    python -m benchmarks.reference --config configs/toy.yaml [--set KEY=VALUE ...]
        [--synthetic [--length 30]] [--steps 20] [--rounds 3] [--json]

The reference is what a user would write with torch's own modules: the same dimensions,
shared and sqrt(d)-scaled embeddings, sinusoidal positions, post-norm `nn.Transformer`, the
shared output projection, `F.cross_entropy(label_smoothing=...)` divided by the target tokens,
and Adam with the same betas, epsilon and learning rate, once with torch's default
implementation and once fused as mtx's. mtx trains through `build_step`, as `mtx train` does
(in fp32 here). Every contender trains on the same batches; each round times every contender
once (the harness's timer), so that a slow moment of the machine hits all alike. Prints
tokens/s (source + target) per contender, the median over rounds, and mtx's ratio to each.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from mtx.bench.harness import result, timed
from mtx.bench.train import prepared_batches, synthetic_batches
from mtx.config import load_config
from mtx.data.prepared import load_manifest
from mtx.device import pick_device
from mtx.model.positions import sinusoidal_table
from mtx.model.transformer import Transformer
from mtx.tokens import PAD_ID
from mtx.train.schedule import rate
from mtx.train.step import build_step


class Reference(nn.Module):
    """The paper's model assembled from torch.nn.Transformer."""

    def __init__(self, m, vocab_size: int) -> None:
        super().__init__()
        self.d = m.d_model
        self.embed = nn.Embedding(vocab_size, m.d_model, padding_idx=PAD_ID)
        self.register_buffer("positions", sinusoidal_table(m.max_positions, m.d_model))
        self.dropout = nn.Dropout(m.dropout)
        self.transformer = nn.Transformer(
            m.d_model,
            m.n_heads,
            m.encoder_layers,
            m.decoder_layers,
            m.d_ff,
            m.dropout,
            batch_first=True,
            layer_norm_eps=m.layer_norm_eps,
        )
        # nn.Transformer ends each stack with an extra LayerNorm that the paper's post-norm
        # model does not have: without them the reference computes the same function as mtx.
        self.transformer.encoder.norm = nn.Identity()
        self.transformer.decoder.norm = nn.Identity()

    def embed_tokens(self, ids):
        return self.dropout(self.embed(ids) * math.sqrt(self.d) + self.positions[: ids.size(1)])

    def forward(self, src, tgt_in):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), src.device)
        h = self.transformer(
            self.embed_tokens(src),
            self.embed_tokens(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD_ID,
            memory_key_padding_mask=src == PAD_ID,
            tgt_is_causal=True,
        )
        return h @ self.embed.weight.t()


def reference_step(model, optimizer, batches, cfg, step, device) -> None:
    lr = rate(step, cfg.model.d_model, cfg.train.warmup_steps, cfg.train.lr_scale)
    for group in optimizer.param_groups:
        group["lr"] = lr
    ntokens = sum(int((b.tgt_out != PAD_ID).sum()) for b in batches)
    for b in batches:
        src, tgt_in, tgt_out = (x.to(device) for x in (b.src, b.tgt_in, b.tgt_out))
        logits = model(src, tgt_in)
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=cfg.train.label_smoothing,
            reduction="sum",
        )
        (loss / ntokens).backward()
    if cfg.train.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def contenders(cfg, vocab: int, device: torch.device) -> dict:
    """name -> step(batches, update number): mtx and the two references, each its own model
    initialised from the same seed."""
    torch.manual_seed(cfg.train.seed)
    cfg.train.precision = "fp32"
    ours = build_step(cfg, Transformer(cfg.model, vocab).to(device).train(), device)
    adam = dict(betas=(cfg.train.adam_beta1, cfg.train.adam_beta2), eps=cfg.train.adam_eps)
    out = {"mtx": ours}
    for name, fused in (("nn.Transformer, torch's default Adam", False),
                        ("nn.Transformer, fused Adam", True)):  # fmt: skip
        ref = Reference(cfg.model, vocab).to(device).train()
        opt = torch.optim.Adam(ref.parameters(), lr=0.0, fused=fused, **adam)
        out[name] = (lambda r, o: lambda g, s: reference_step(r, o, g, cfg, s, device))(ref, opt)
    return out


def race(args) -> dict:
    cfg = load_config(args.config, args.set)
    device = pick_device(cfg.train.device)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    U, steps = cfg.train.update_freq, args.steps
    if args.synthetic:
        vocab = cfg.data.vocab_size
        batches = synthetic_batches(cfg, vocab, steps * U, args.length)
    else:
        batches = prepared_batches(cfg, steps * U)
        vocab = load_manifest(cfg).vocab_size
    updates = [batches[i * U : (i + 1) * U] for i in range(steps)]
    tokens = sum(b.src_tokens + b.tgt_tokens for b in batches)
    steppers = contenders(cfg, vocab, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    for step in steppers.values():  # warm-up: allocations, kernels, Adam moments
        for i, group in enumerate(updates[:3]):
            step(group, i + 1)
    speeds: dict[str, list[float]] = {name: [] for name in steppers}
    for r in range(args.rounds):
        for name, step in steppers.items():
            timing, _ = timed(
                lambda s=step: [s(g, i + 4) for i, g in enumerate(updates)], 1, 0, sync
            )
            speeds[name].append(tokens / timing.median)
        print(f"round {r + 1}: " + ", ".join(f"{n}: {s[-1]:,.0f}" for n, s in speeds.items()))
    params = sum(p.numel() for p in steppers["mtx"].model.parameters())
    about = (f"{cfg.model.d_model}d, {cfg.model.encoder_layers}+{cfg.model.decoder_layers} "
             f"layers, vocabulary {vocab}, {params:,} parameters; {steps} updates of "
             f"{tokens / steps:,.0f} tokens per round; device {device}, "
             f"{torch.get_num_threads()} threads, fp32")  # fmt: skip
    return {"about": about, "tokens_per_s": speeds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override")
    parser.add_argument("--synthetic", action="store_true", help="random token batches")
    parser.add_argument("--length", type=int, default=30, help="mean synthetic length")
    parser.add_argument("--steps", type=int, default=20, help="updates timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the JSON result")
    args = parser.parse_args(argv)
    figures = race(args)
    median = {name: statistics.median(s) for name, s in figures["tokens_per_s"].items()}
    print(figures["about"])
    print("\ntokens/s (median over rounds)")
    for name, value in median.items():
        print(f"  {name:<38} {value:>10,.0f}   mtx is {median['mtx'] / value:.2f}x")
    if args.json:
        print(json.dumps(result("reference", figures | {"median": median}, **vars(args))))


if __name__ == "__main__":
    main()
