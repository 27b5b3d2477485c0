"""Multi-head scaled dot-product attention (paper section 3.2).

Shape legend: B batch, T query length, S key/value length, H heads, d_k = d_model / H.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The softmax and weighted sum run in `F.scaled_dot_product_attention`, which picks torch's fused
(flash / memory-efficient) kernels. Masks are boolean, True where a query may attend.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split_heads(self, x: Tensor) -> Tensor:
        B, n, _ = x.shape
        return x.view(B, n, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, n, d_k)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `memory` (B, S, d_model), each (B, H, S, d_k)."""
        return self.split_heads(self.k_proj(memory)), self.split_heads(self.v_proj(memory))

    def forward(
        self,
        query: Tensor,  # (B, T, d_model)
        key_value: Tensor | None = None,  # (B, S, d_model); None: self-attention on `query`
        mask: Tensor | None = None,  # (B, 1 or T, S) or broadcastable, bool, True = attend
        causal: bool = False,  # query i attends keys <= i (T == S, no cache)
        kv: tuple[Tensor, Tensor] | None = None,  # precomputed (k, v), each (B, H, S, d_k)
    ) -> Tensor:
        q = self.split_heads(self.q_proj(query))  # (B, H, T, d_k)
        if kv is None:
            kv = self.project_kv(query if key_value is None else key_value)
        k, v = kv
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
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_k)  # (B, T, d_model)
        return self.out_proj(out)
