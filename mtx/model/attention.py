"""Multi-head scaled dot-product attention (paper section 3.2).

Shape legend: B batch, T query length, S key/value length, H heads, d_k = d_model / H.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The projections W^Q, W^K, W^V of all heads are stored as one (3 d_model, d_model) matrix, so
self-attention computes queries, keys and values in one matrix product (and cross-attention
keys and values in one). In training, the softmax and weighted sum run in
`F.scaled_dot_product_attention`, which picks torch's fused (flash / memory-efficient) kernels;
a mask of None lets it take the fastest of them. In inference they are written out
(`attention`), so that a sentence gets the same numbers in any batch. Masks are boolean, True
where a query may attend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtx.model.rows import linear


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
        return self._heads(linear(x, self.in_proj.weight[:d], self.in_proj.bias[:d]), 1)[0]

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `memory` (B, S, d_model), each (B, H, S, d_k)."""
        d = self.d_model
        kv = linear(memory, self.in_proj.weight[d:], self.in_proj.bias[d:])
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
        keys/values once into cache["memory_k"] and cache["memory_v"].

        Cached memory keys/values may hold fewer rows than `query`: with Bm memory rows and
        B = Bm * G query rows, each group of G consecutive query rows (the beams of one
        sentence) attends to one memory row, so a beam search computes and keeps the memory's
        keys/values once per sentence rather than once per beam."""
        if not self.cross:
            q, k, v = self._heads(linear(query, self.in_proj.weight, self.in_proj.bias), 3)
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
        B, H, T, d_k = q.shape
        G = B // k.size(0)  # query rows per key/value row
        if G > 1:  # (B, H, T, d_k) -> (Bm, H, G * T, d_k): a sentence's beams as one query
            q = q.view(-1, G, H, T, d_k).transpose(1, 2).reshape(-1, H, G * T, d_k)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, T or 1, S), broadcast over heads
        if self.training:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout, is_causal=causal and mask is None
            )  # (B / G, H, G * T, d_k)
        else:
            out = attention(q, k, v, mask, causal)
        out = out.view(-1, H, G, T, d_k).transpose(1, 2)  # (B / G, G, H, T, d_k)
        out = out.transpose(2, 3).reshape(B, T, self.d_model)  # (B, T, d_model)
        return linear(out, self.out_proj.weight, self.out_proj.bias)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V written out, for inference: unlike the fused kernels,
    whose choice of blocking and threads depends on the batch size, every (sentence, head)
    here is computed the same way in any batch (see model/rows.py for why that matters).
    q (B, H, T, d_k), k and v (B, H, S, d_k), mask (B, 1, T or 1, S) True = attend."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # one layout, one kernel
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.size(-1)))
    if causal and mask is None:
        T, S = scores.shape[-2:]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    if mask is not None:
        scores = scores.masked_fill(~mask, -torch.inf)
    return torch.matmul(torch.softmax(scores, dim=-1), v)
