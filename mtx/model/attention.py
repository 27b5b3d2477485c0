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

Relative position representations (Shaw et al. 2018, `model.positions: relative`), in
self-attention: with a^K_ij = w^K_clip(j - i, k) and a^V_ij = w^V_clip(j - i, k), learned
per head for the 2k + 1 clipped distances,

    e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_k),   z_i = sum_j softmax(e_i)_j (v_j + a^V_ij)

computed without loops over positions: q_i w^K_r for every distance r is one (T, 2k + 1)
product, gathered into the (T, S) scores; the attention weights of each query are summed per
distance (scatter-add) and multiplied by w^V. Shaw et al. share w across heads; here each head
has its own. These run written out in training too (the fused kernels have no value term).

What only inference needs is applied from beside: incremental decoding's keys and values
through a cache (model/cache.py: growing, or static for CUDA graphs), sources of several
lengths in one batch (model/groups.py), weights packed for the CPU (model/packed.py, through
`project`) and the reading of its weights (model/capture.py: `listeners` are told them). The
recurrent baseline's attention is in model/rnn_attention.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtx.model.cache import LayerCache
from mtx.model.groups import Groups, attend_folded_groups, attend_groups
from mtx.model.packed import Packable


class RelativePositions(nn.Module):
    """The learned w^K and w^V of Shaw et al., (H, 2k + 1, d_k) each, for distances -k..k."""

    def __init__(self, n_heads: int, d_k: int, max_distance: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.keys = nn.Parameter(torch.empty(n_heads, 2 * max_distance + 1, d_k))
        self.values = nn.Parameter(torch.empty(n_heads, 2 * max_distance + 1, d_k))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.keys, self.values):
            nn.init.normal_(w, std=w.size(-1) ** -0.5)

    def index(self, T: int, S: int, start: int | Tensor, device: torch.device) -> Tensor:
        """(T, S) long: clip(j - i, -k, k) + k for queries at positions start.. start + T - 1
        and keys at positions 0.. S - 1."""
        i = (torch.arange(T, device=device) + start).unsqueeze(1)  # start: an int or a tensor
        j = torch.arange(S, device=device).unsqueeze(0)
        k = self.max_distance
        return (j - i).clamp(-k, k) + k


class MultiHeadAttention(Packable, nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        cross: bool = False,
        max_relative_position: int | None = None,  # relative positions (self-attention only)
        init: str = "fairseq",  # model.init: fairseq or xavier (see reset_parameters)
    ) -> None:
        super().__init__()
        self.cross = cross  # attends over a memory (encoder output) rather than its own input
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout = dropout
        self.init = init
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # rows: W^Q, W^K, W^V
        self.out_proj = nn.Linear(d_model, d_model)
        self.relative = None
        if max_relative_position is not None:
            assert not cross, "relative positions are for self-attention"
            self.relative = RelativePositions(n_heads, self.d_k, max_relative_position)
        # told each forward's weights (B, H, T, S): what model/capture.py reads from beside
        self.listeners: list[Callable[[Tensor], None]] = []
        self.linear_names = ("q", "kv", "out") if cross else ("qkv", "out")  # see Packable
        self.packed = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each of W^Q, W^K, W^V Xavier-uniform as a (d_model, d_model) matrix, W^O Xavier-uniform
        with a zero bias. `init` "fairseq": W^Q, W^K, W^V with gain 1/sqrt(2) and their biases
        uniform in +-1/sqrt(d_model) (nn.Linear's); "xavier": gain 1, zero biases."""
        d, fairseq = self.d_model, self.init == "fairseq"
        bound = math.sqrt(6.0 / (2 * d)) * (2**-0.5 if fairseq else 1.0)
        nn.init.uniform_(self.in_proj.weight, -bound, bound)
        if fairseq:
            nn.init.uniform_(self.in_proj.bias, -(d**-0.5), d**-0.5)
        else:
            nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        if self.relative is not None:
            self.relative.reset_parameters()

    def _heads(self, x: Tensor, parts: int) -> tuple[Tensor, ...]:
        """(B, n, parts * d_model) -> `parts` tensors of (B, H, n, d_k)."""
        B, n, _ = x.shape
        return x.view(B, n, parts, self.n_heads, self.d_k).permute(2, 0, 3, 1, 4).unbind(0)

    def linear_layer(self, name: str) -> tuple[Tensor, Tensor | None, str | None]:
        """ "qkv": W^Q, W^K, W^V together; "q" and "kv" (cross-attention): W^Q, and W^K with
        W^V; "out": W^O."""
        w, b, d = self.in_proj.weight, self.in_proj.bias, self.d_model
        if name == "out":
            return self.out_proj.weight, self.out_proj.bias, None
        if name == "qkv":
            return w, b, None
        return (w[:d], b[:d], None) if name == "q" else (w[d:], b[d:], None)

    def project_q(self, x: Tensor) -> Tensor:
        return self._heads(self.project("q", x), 1)[0]

    def project_kv(self, memory: Tensor | Groups) -> tuple[Tensor, Tensor]:
        """Keys and values of `memory` (B, S, d_model), each (B, H, S, d_k) (each `Groups`
        of those for a `Groups` memory)."""
        if isinstance(memory, Groups):
            kv = [self.project_kv(part) for part in memory.parts]
            return Groups([k for k, _ in kv]), Groups([v for _, v in kv])
        return self._heads(self.project("kv", memory), 2)

    def forward(
        self,
        query: Tensor,  # (B, T, d_model)
        memory: Tensor | Groups | None = None,  # (B, S, d_model), cross-attention only
        mask: Tensor | None = None,  # (B, 1 or T, S) or broadcastable, bool, True = attend
        causal: bool = False,  # query i attends keys <= i (T == S, no cache)
        cache: LayerCache | None = None,  # incremental decoding (model/cache.py)
    ) -> Tensor:
        """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, (B, T, d_model): queries from
        `query`, keys and values from `query` (self-attention) or `memory` (cross-attention).

        With `cache`, self-attention adds the new positions' keys and values to those of the
        positions decoded before and attends over all of them; cross-attention computes the
        memory's keys and values once. Cached memory keys and values may hold fewer rows than
        `query`: with Bm memory rows and B = Bm * G query rows, each group of G consecutive
        query rows (the beams of one sentence) attends to one memory row, so a beam search
        keeps the memory's keys and values once per sentence rather than once per beam."""
        if self.cross:
            q = self.project_q(query)
            k, v = (
                self.project_kv(memory) if cache is None else cache.memory(self.project_kv, memory)
            )
        else:
            q, k, v = self._heads(self.project("qkv", query), 3)
            if cache is not None:  # the cache says which keys each query reads

                def attend(q: Tensor, k: Tensor, v: Tensor, mask, start) -> Tensor:
                    return self.attend(q, k, v, mask, causal, start)

                return self.project("out", cache.attend(q, k, v, mask, attend))
        return self.project("out", self.attend(q, k, v, mask, causal, 0))

    def attend(
        self, q: Tensor, k: Tensor | Groups, v: Tensor | Groups, mask, causal: bool, start
    ) -> Tensor:
        """softmax(Q K^T / sqrt(d_k)) V of each head, concatenated (before W^O): q (B, H, T,
        d_k) over k, v (B / G, H, S, d_k) -> (B, T, d_model). In training torch's fused
        kernels, in inference `attention` written out; keys and values of sources of several
        lengths (`Groups`) group by group (model/groups.py)."""
        if isinstance(k, Groups):
            if self.listeners:
                raise ValueError("the attention is read over sources of one length")
            if self.training:
                return attend_groups(q, k, v, mask, lambda *part: self.attend(*part, False, 0))
            return attend_folded_groups(q, k, v, mask, lambda *part: attention(*part, False)[0])
        B, H, T, d_k = q.shape
        G = B // k.size(0)  # query rows per key/value row
        if G > 1:  # (B, H, T, d_k) -> (Bm, H, G * T, d_k): a sentence's beams as one query
            q = q.view(-1, G, H, T, d_k).transpose(1, 2).reshape(-1, H, G * T, d_k)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, T or 1, S), broadcast over heads
        if self.training and self.relative is None and not self.listeners:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout, is_causal=causal and mask is None
            )  # (B / G, H, G * T, d_k)
        else:
            dropout = self.dropout if self.training else 0.0
            out, weights = attention(q, k, v, mask, causal, self.relative, start, dropout)
            if self.listeners:  # (B, H, T, S), a sentence's beams back as separate rows
                S = weights.size(-1)
                weights = weights.view(-1, H, G, T, S).transpose(1, 2).reshape(B, H, T, S)
                for listener in self.listeners:  # in training with their graph (guided loss)
                    listener(weights)
        out = out.view(-1, H, G, T, d_k).transpose(1, 2)  # (B / G, G, H, T, d_k)
        return out.transpose(2, 3).reshape(B, T, self.d_model)  # (B, T, d_model)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    relative: RelativePositions | None = None,
    start: int = 0,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V written out (with Shaw et al.'s terms given `relative`,
    queries at positions start..), returning the output and the attention weights. Unlike the
    fused kernels, whose blocking and threads depend on the batch size, every (sentence, head)
    here is computed the same way in any batch (see model/rows.py for why that matters).
    q (B, H, T, d_k), k and v (B, H, S, d_k), mask (B, 1, T or 1, S) True = attend."""
    B, H, T, d_k = q.shape
    S = k.size(2)
    # (B * H, n, d_k) contiguous, so that every (sentence, head) takes one kernel: torch.bmm
    # is what torch.matmul calls on these, with fewer small operations around it. The heads of
    # one sentence (B = 1) would otherwise reach it as a strided view where several sentences
    # reach it copied, and with some shapes (d_k 10 over 8 keys) the two layouts round apart.
    q3, k3, v3 = (x.reshape(-1, x.size(2), d_k).contiguous() for x in (q, k, v))
    scores = torch.bmm(q3, k3.transpose(1, 2)).view(B, H, T, S)
    if relative is not None:
        index = relative.index(T, S, start, q.device).expand(B, H, T, S)
        # w^K transposed into a contiguous copy: broadcast over the batch, a transposed view
        # would reach BLAS transposed alone and copied (untransposed) in a batch, and the two
        # layouts take kernels that round differently
        keys_t = relative.keys.to(q.dtype).transpose(-1, -2).contiguous()  # (H, d_k, R)
        by_distance = torch.matmul(q, keys_t)  # (B, H, T, R)
        scores = scores + torch.gather(by_distance, -1, index)
    scores = scores.mul_(1.0 / math.sqrt(d_k))
    if causal and mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    if mask is not None:
        scores = scores.masked_fill_(~mask, -torch.inf)
    weights = torch.softmax(scores, dim=-1)
    dropped = F.dropout(weights, dropout) if dropout > 0 else weights
    out = torch.bmm(dropped.view(-1, T, S), v3).view(B, H, T, d_k)
    if relative is not None:
        R = relative.keys.size(1)
        per_distance = dropped.new_zeros(B, H, T, R).scatter_add_(-1, index, dropped)
        out = out + torch.matmul(per_distance, relative.values.to(out.dtype))
    return out, weights
