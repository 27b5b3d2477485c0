"""Multi-head scaled dot-product attention (paper section 3.2).

Shape legend: B batch, T query length, S key/value length, H heads, d_k = d_model / H.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The projections W^Q, W^K, W^V of all heads are stored as one (3 d_model, d_model) matrix, so
self-attention computes queries, keys and values in one matrix product (and cross-attention
keys and values in one). The softmax and weighted sum run in `F.scaled_dot_product_attention`,
which picks torch's fused (flash / memory-efficient) kernels; a mask of None lets it take the
fastest of them. Masks are boolean, True where a query may attend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, cross: bool = False
    ) -> None:
        super().__init__()
        self.cross = cross  # attends over a memory (encoder output) rather than its own input
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout = dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # rows: W^Q, W^K, W^V
        self.out_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform for each of W^Q, W^K, W^V as a (d_model, d_model) matrix, zero biases."""
        bound = math.sqrt(6.0 / (2 * self.d_model))
        nn.init.uniform_(self.in_proj.weight, -bound, bound)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def _heads(self, x: Tensor, parts: int) -> tuple[Tensor, ...]:
        """(B, n, parts * d_model) -> `parts` tensors of (B, H, n, d_k)."""
        B, n, _ = x.shape
        return x.view(B, n, parts, self.n_heads, self.d_k).permute(2, 0, 3, 1, 4).unbind(0)

    def project_q(self, x: Tensor) -> Tensor:
        d = self.d_model
        return self._heads(F.linear(x, self.in_proj.weight[:d], self.in_proj.bias[:d]), 1)[0]

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `memory` (B, S, d_model), each (B, H, S, d_k)."""
        d = self.d_model
        kv = F.linear(memory, self.in_proj.weight[d:], self.in_proj.bias[d:])
        return self._heads(kv, 2)

    def forward(
        self,
        query: Tensor,  # (B, T, d_model)
        memory: Tensor | None = None,  # (B, S, d_model), cross-attention only
        mask: Tensor | None = None,  # (B, 1 or T, S) or broadcastable, bool, True = attend
        causal: bool = False,  # query i attends keys <= i (T == S, no cache)
        cache: dict[str, Tensor] | None = None,  # incremental decoding, see below
    ) -> Tensor:
        """With `cache`, self-attention appends the new positions' keys/values to cache["k"] and
        cache["v"] and attends over all of them; attention over `memory` computes its
        keys/values once into cache["memory_k"] and cache["memory_v"]."""
        if not self.cross:
            q, k, v = self._heads(self.in_proj(query), 3)
            if cache is not None:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        else:
            q = self.project_q(query)
            if cache is None:
                k, v = self.project_kv(memory)
            else:
                if "memory_k" not in cache:
                    cache["memory_k"], cache["memory_v"] = self.project_kv(memory)
                k, v = cache["memory_k"], cache["memory_v"]
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, T or 1, S), broadcast over heads
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal and mask is None,
        )  # (B, H, T, d_k)
        B, _, T, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model)
        return self.out_proj(out)
