"""FLOPs of the Transformer, counted from its architecture (matrix products, 2 FLOPs per
multiply-add; attention scores and weighted sums included, causal masking not discounted).

Training costs 3x the forward pass (forward, and a backward of twice its cost).
"""

from __future__ import annotations

from mtx.config import ModelConfig


def forward_flops(cfg: ModelConfig, vocab_size: int, src_len: int, tgt_len: int) -> int:
    """Forward FLOPs for one sentence pair of `src_len` source and `tgt_len` target tokens."""
    d, f, S, T = cfg.d_model, cfg.d_ff, src_len, tgt_len
    # relative positions: q w^K and (weights per distance) w^V over the 2k + 1 distances
    R = 2 * cfg.max_relative_position + 1 if cfg.positions == "relative" else 0
    encoder = cfg.encoder_layers * (
        4 * 2 * d * d * S  # q, k, v, output projections
        + 2 * 2 * S * S * d  # Q K^T and weights x V
        + 2 * 2 * S * R * d  # relative positions
        + 2 * 2 * d * f * S  # feed-forward
    )
    decoder = cfg.decoder_layers * (
        4 * 2 * d * d * T
        + 2 * 2 * T * T * d  # self-attention
        + 2 * 2 * T * R * d
        + 2 * 2 * d * d * T
        + 2 * 2 * d * d * S
        + 2 * 2 * T * S * d  # cross-attention
        + 2 * 2 * d * f * T  # feed-forward
    )
    output = 2 * d * vocab_size * T  # shared pre-softmax projection
    return encoder + decoder + output


def training_flops_per_token(
    cfg: ModelConfig, vocab_size: int, src_len: int, tgt_len: int
) -> float:
    """Training FLOPs per token (source + target) for pairs of the given lengths."""
    return 3 * forward_flops(cfg, vocab_size, src_len, tgt_len) / (src_len + tgt_len)
