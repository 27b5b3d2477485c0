"""Encoder and decoder layers (paper section 3.1).

Shape legend: B batch, S source length, T target length, d = d_model.

Each sublayer is, with `model.norm`:
- post (the paper): LayerNorm(x + Dropout(Sublayer(x)))
- pre (Wang et al. 2019, Xiong et al. 2020): x + Dropout(Sublayer(LayerNorm(x))); the stacks
  then end with a LayerNorm of their own (transformer.py).
The feed-forward sublayer is FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3), d_ff wide
(`model.decoder_d_ff` in the decoder, when set); `model.activation` puts swish or GELU in
place of the ReLU (pretrained models' choices; model/rows.py has them). With `model.positions: relative`,
self-attention adds Shaw et al.'s relative terms (attention.py). With `model.decoder_self:
ssru`, a decoder layer's first sublayer is an SSRU (ssru.py) in place of self-attention.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtx.config import ModelConfig
from mtx.model.attention import MultiHeadAttention
from mtx.model.cache import LayerCache
from mtx.model.decoder_self import decoder_self
from mtx.model.packed import Packable
from mtx.model.positions import relative_distance


class FeedForward(Packable, nn.Module):
    def __init__(
        self, d_model: int, d_ff: int, init: str = "fairseq", activation: str = "relu"
    ) -> None:
        super().__init__()
        self.init, self.activation = init, activation
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.linear_names, self.packed = ("fc1", "fc2"), {}  # see Packable
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """`init` "fairseq": nn.Linear's (weights and biases uniform in +-1/sqrt(fan_in));
        "xavier": Xavier-uniform weights, zero biases."""
        for fc in (self.fc1, self.fc2):
            if self.init == "fairseq":
                fc.reset_parameters()
            else:
                nn.init.xavier_uniform_(fc.weight)
                nn.init.zeros_(fc.bias)

    def linear_layer(self, name: str) -> tuple[Tensor, Tensor | None, str | None]:
        fc = self.fc1 if name == "fc1" else self.fc2
        return fc.weight, fc.bias, self.activation if name == "fc1" else None

    def forward(self, x: Tensor) -> Tensor:
        return self.project("fc2", self.project("fc1", x))


def residual(x: Tensor, f, norm: nn.LayerNorm, dropout: nn.Dropout, pre: bool) -> Tensor:
    """The residual connection around sublayer `f`, its LayerNorm after (post) or before (pre)."""
    if pre:
        return x + _drop(dropout, f(norm(x)))
    return norm(x + _drop(dropout, f(x)))


def _drop(dropout: nn.Dropout, x: Tensor) -> Tensor:
    return dropout(x) if dropout.training and dropout.p > 0 else x  # a call less in inference


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.n_heads, cfg.attention_dropout,
            max_relative_position=relative_distance(cfg), init=cfg.init,
        )  # fmt: skip
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.init, cfg.activation)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre = cfg.norm == "pre"

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        # x: (B, S, d); src_mask: (B, 1, S), True on real tokens
        x = residual(
            x,
            lambda h: self.self_attn(h, mask=src_mask),
            self.self_attn_norm,
            self.dropout,
            self.pre,
        )
        return residual(x, self.ffn, self.ffn_norm, self.dropout, self.pre)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kind = decoder_self(cfg)  # model/decoder_self.py: the paper's attention, an SSRU, ...
        self.recurrent = kind.recurrent
        self.self_attn = kind.build(cfg)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn = MultiHeadAttention(
            cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=True, init=cfg.init
        )
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.decoder_d_ff or cfg.d_ff, cfg.init, cfg.activation)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre = cfg.norm == "pre"

    def forward(
        self,
        x: Tensor,  # (B, T, d)
        memory: Tensor | None,  # (B, S, d) encoder output; None when `cache` holds its k/v
        src_mask: Tensor | None,  # (B, 1, S)
        cache: LayerCache | None = None,  # incremental decoding (model/cache.py)
        full: Tensor | None = None,  # (B, 1, T) the target's own tokens: a full-context pass
    ) -> Tensor:
        """Without `cache`: the whole target prefix at once, causally masked; with `full`
        (Transformer.full_context), every position attends to every target token that `full`
        marks (no causal mask: the alignment pass of Garg et al. 2019).

        With `cache` (incremental decoding): `x` holds only the newest position(s); keys and
        values of earlier positions are read from, and the new ones appended to, `cache`, and
        the cross-attention keys/values of `memory` are computed once and kept there. A
        recurrent self-sublayer (an SSRU) continues from the cell kept there instead.
        """
        if self.recurrent:
            mask, causal = None, False  # a recurrence is causal by construction
        elif full is not None:
            mask, causal = full, False
        elif cache is None:
            mask, causal = None, True
        else:
            # New positions attend to every cached position and causally among themselves.
            t = x.size(1)
            mask = None if t == 1 else _tail_causal_mask(t, t + cache.length, x.device)
            causal = False

        def self_attention(h: Tensor) -> Tensor:
            if self.recurrent:
                return self.self_attn(h, cache)
            return self.self_attn(h, mask=mask, causal=causal, cache=cache)

        def cross_attention(h: Tensor) -> Tensor:
            return self.cross_attn(h, memory, mask=src_mask, cache=cache)

        x = residual(x, self_attention, self.self_attn_norm, self.dropout, self.pre)
        x = residual(x, cross_attention, self.cross_attn_norm, self.dropout, self.pre)
        return residual(x, self.ffn, self.ffn_norm, self.dropout, self.pre)


def _tail_causal_mask(t: int, n: int, device: torch.device) -> Tensor:
    """(t, n) bool mask for the last t of n positions: query i sees keys <= n - t + i."""
    return torch.ones(t, n, dtype=torch.bool, device=device).tril(diagonal=n - t)
