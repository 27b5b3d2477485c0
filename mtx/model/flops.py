"""FLOPs of a model, counted from its architecture (matrix products, 2 FLOPs per multiply-add;
attention scores and weighted sums included, causal masking not discounted; the recurrent
baseline's gate nonlinearities are not matrix products and are not counted).

Training costs 3x the forward pass (forward, and a backward of twice its cost).
"""

from __future__ import annotations

from mtx.config import ModelConfig
from mtx.model.decoder_self import decoder_self
from mtx.model.rnn import GATES


def forward_flops(cfg: ModelConfig, vocab_size: int, src_len: int, tgt_len: int) -> int:
    """Forward FLOPs for one sentence pair of `src_len` source and `tgt_len` target tokens."""
    if cfg.arch == "rnn":
        return rnn_forward_flops(cfg, vocab_size, src_len, tgt_len)
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
        decoder_self(cfg).flops(cfg, T, R)  # model/decoder_self.py
        + 2 * 2 * d * d * T  # cross-attention: q and output projections
        + 2 * 2 * d * d * S  # its k, v of the encoder output
        + 2 * 2 * T * S * d  # its scores and weighted sums
        + 2 * 2 * d * (cfg.decoder_d_ff or f) * T  # feed-forward
    )
    output = 2 * d * vocab_size * T  # shared pre-softmax projection
    return encoder + decoder + output


def rnn_forward_flops(cfg: ModelConfig, vocab_size: int, src_len: int, tgt_len: int) -> int:
    """`forward_flops` of the recurrent baseline (model/rnn.py); g gates of h units."""
    d, S, T, g = cfg.d_model, src_len, tgt_len, GATES[cfg.rnn_cell]
    h = d // 2
    encoder = cfg.encoder_layers * 2 * 2 * g * h * (d + h) * S  # two directions
    bridge = 2 * d * cfg.decoder_layers * d
    decoder = 2 * g * d * (2 * d + d) * T + (cfg.decoder_layers - 1) * 2 * g * d * (d + d) * T
    scores = {
        "dot": 2 * S * d * T,
        "scaled_dot": 2 * S * d * T,
        "general": 2 * d * d * S + 2 * S * d * T,
        "additive": 2 * d * d * S + 2 * d * d * T + 2 * S * d * T,
        "location": 2 * d * S * T,
    }[cfg.attention]
    context = 2 * S * d * T
    combine = 2 * 2 * d * d * T
    output = 2 * d * vocab_size * T
    return encoder + bridge + decoder + scores + context + combine + output


def training_flops_per_token(
    cfg: ModelConfig, vocab_size: int, src_len: int, tgt_len: int
) -> float:
    """Training FLOPs per token (source + target) for pairs of the given lengths."""
    return 3 * forward_flops(cfg, vocab_size, src_len, tgt_len) / (src_len + tgt_len)
