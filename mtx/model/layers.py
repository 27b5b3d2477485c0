"""Encoder and decoder layers (paper section 3.1), post-norm as in the paper.

Shape legend: B batch, S source length, T target length, d = d_model.

Each sublayer is LayerNorm(x + Dropout(Sublayer(x))); the feed-forward sublayer is
FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtx.config import ModelConfig
from mtx.model.attention import MultiHeadAttention
from mtx.model.rows import linear


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(linear(x, self.fc1.weight, self.fc1.bias))
        return linear(h, self.fc2.weight, self.fc2.bias)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        # x: (B, S, d); src_mask: (B, 1, S), True on real tokens
        x = self.self_attn_norm(x + self.dropout(self.self_attn(x, mask=src_mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn = MultiHeadAttention(
            cfg.d_model, cfg.n_heads, cfg.attention_dropout, cross=True
        )
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,  # (B, T, d)
        memory: Tensor | None,  # (B, S, d) encoder output; None when `cache` holds its k/v
        src_mask: Tensor | None,  # (B, 1, S)
        cache: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Without `cache`: the whole target prefix at once, causally masked.

        With `cache` (incremental decoding): `x` holds only the newest position(s); keys and
        values of earlier positions are read from, and the new ones appended to, `cache`, and
        the cross-attention keys/values of `memory` are computed once and kept there.
        """
        if cache is None:
            h = self.self_attn(x, causal=True)
        else:
            # New positions attend to every cached position and causally among themselves.
            t, n = x.size(1), x.size(1) + (cache["k"].size(2) if "k" in cache else 0)
            mask = None if t == 1 else _tail_causal_mask(t, n, x.device)
            h = self.self_attn(x, mask=mask, cache=cache)
        x = self.self_attn_norm(x + self.dropout(h))
        h = self.cross_attn(x, memory, mask=src_mask, cache=cache)
        x = self.cross_attn_norm(x + self.dropout(h))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


def _tail_causal_mask(t: int, n: int, device: torch.device) -> Tensor:
    """(t, n) bool mask for the last t of n positions: query i sees keys <= n - t + i."""
    return torch.ones(t, n, dtype=torch.bool, device=device).tril(diagonal=n - t)
