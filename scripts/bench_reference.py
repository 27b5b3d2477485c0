"""Training speed of mtx against a plain `torch.nn.Transformer` model, side by side in one run.

    python scripts/bench_reference.py --config configs/toy.yaml [--set KEY=VALUE ...]
        [--synthetic [--length 30]] [--steps 20] [--rounds 3]

The reference is what a user would write with torch's own modules: the same dimensions,
shared and sqrt(d)-scaled embeddings, sinusoidal positions, post-norm `nn.Transformer`, the
shared output projection, `F.cross_entropy(label_smoothing=...)` divided by the target tokens,
and Adam with the same betas, epsilon and learning rate, once with torch's default
implementation and once fused as mtx's. Every contender trains on the same batches; rounds
alternate between them so that a slow moment of the machine hits all alike. Prints tokens/s
(source + target) per contender, the median over rounds, and mtx's ratio to each reference.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from mtx.bench import prepared_batches, synchronize, synthetic_batches
from mtx.config import load_config
from mtx.data.prepare import prepared_dir
from mtx.device import pick_device
from mtx.model.positions import sinusoidal_table
from mtx.model.transformer import Transformer
from mtx.tokens import PAD_ID
from mtx.train.schedule import rate
from mtx.train.step import Precision, make_optimizer, train_step


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
    ntokens = sum(int((b["tgt_out"] != PAD_ID).sum()) for b in batches)
    for b in batches:
        b = {k: b[k].to(device) for k in ("src", "tgt_in", "tgt_out")}
        logits = model(b["src"], b["tgt_in"])
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            b["tgt_out"].flatten(),
            ignore_index=PAD_ID,
            label_smoothing=cfg.train.label_smoothing,
            reduction="sum",
        )
        (loss / ntokens).backward()
    if cfg.train.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE override")
    parser.add_argument("--synthetic", action="store_true", help="random token batches")
    parser.add_argument("--length", type=int, default=30, help="mean synthetic length")
    parser.add_argument("--steps", type=int, default=20, help="updates timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
        vocab = json.loads((prepared_dir(cfg) / "manifest.json").read_text())["vocab_size"]
    updates = [batches[i * U : (i + 1) * U] for i in range(steps)]
    tokens = sum(int((b["src"] != PAD_ID).sum() + (b["tgt_out"] != PAD_ID).sum()) for b in batches)

    torch.manual_seed(cfg.train.seed)
    ours = Transformer(cfg.model, vocab).to(device).train()
    ours_opt = make_optimizer(ours, cfg)
    fp32 = Precision(device)
    ref = Reference(cfg.model, vocab).to(device).train()
    adam = dict(betas=(cfg.train.adam_beta1, cfg.train.adam_beta2), eps=cfg.train.adam_eps)
    ref_default = torch.optim.Adam(ref.parameters(), lr=0.0, **adam)
    ref2 = Reference(cfg.model, vocab).to(device).train()
    ref_fused = torch.optim.Adam(ref2.parameters(), lr=0.0, fused=True, **adam)
    contenders = {
        "mtx": lambda g, s: train_step(ours, ours_opt, g, cfg, s, fp32),
        "nn.Transformer, torch's default Adam": lambda g, s: reference_step(
            ref, ref_default, g, cfg, s, device
        ),
        "nn.Transformer, fused Adam": lambda g, s: reference_step(
            ref2, ref_fused, g, cfg, s, device
        ),
    }
    params = sum(p.numel() for p in ours.parameters())
    print(
        f"{cfg.model.d_model}d, {cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers, "
        f"vocabulary {vocab}, {params:,} parameters; {steps} updates of "
        f"{tokens / steps:,.0f} tokens per round; device {device}, "
        f"{torch.get_num_threads()} threads, fp32"
    )
    speeds: dict[str, list[float]] = {name: [] for name in contenders}
    for step in contenders.values():  # warm-up: allocations, kernels, Adam moments
        for i, group in enumerate(updates[:3]):
            step(group, i + 1)
    for r in range(args.rounds):
        for name, step in contenders.items():
            synchronize(device)
            start = time.perf_counter()
            for i, group in enumerate(updates):
                step(group, i + 4)
            synchronize(device)
            speeds[name].append(tokens / (time.perf_counter() - start))
        print(f"round {r + 1}: " + ", ".join(f"{n}: {s[-1]:,.0f}" for n, s in speeds.items()))
    median = {name: statistics.median(s) for name, s in speeds.items()}
    print("\ntokens/s (median over rounds)")
    for name, value in median.items():
        ratio = median["mtx"] / value
        print(f"  {name:<38} {value:>10,.0f}   mtx is {ratio:.2f}x")


if __name__ == "__main__":
    main()
