"""The attention of the recurrent baseline (model/rnn.py), `model.attention`: the score
functions of Bahdanau et al. (2014) and Luong et al. (2015).

Shape legend: N decoder rows (B sentences x G beams), B sentences, S source length, d = d_model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from mtx.model.rows import linear


class RecurrentAttention(nn.Module):
    """The attention of the recurrent baseline (model/rnn.py): one decoder state h_t (d) over
    the encoder states h_s (S, d), with the score functions of Bahdanau et al. (2014) and
    Luong et al. (2015), `model.attention`:

        additive    score(h_t, h_s) = v . tanh(W_q h_t + W_k h_s)   (Bahdanau; Luong's "concat")
        general     score(h_t, h_s) = h_t . W_a h_s
        dot         score(h_t, h_s) = h_t . h_s
        scaled_dot  score(h_t, h_s) = h_t . h_s / sqrt(d)
        location    scores(h_t) = W_a h_t + b, one per source position (the first S of
                    max_positions rows): the weights depend on the decoder state only

    a_t = softmax(scores over the real source positions), context c_t = sum_s a_ts h_s.
    The source side of a score (W_k h_s, W_a h_s) is computed once per sentence (`keys`).

    Queries may hold G rows per memory row (the beams of one sentence): query rows
    g * G .. g * G + G - 1 attend to memory row g.
    """

    def __init__(self, score: str, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.score = score
        self.query_proj = self.key_proj = self.v = self.location = None
        if score in ("general", "additive"):
            self.key_proj = nn.Linear(d_model, d_model, bias=False)  # W_a or W_k
        if score == "additive":
            self.query_proj = nn.Linear(d_model, d_model)  # W_q, with the score's bias
            self.v = nn.Parameter(torch.empty(d_model))
        if score == "location":
            self.location = nn.Linear(d_model, max_positions)
        # told each decode's weights (rows, 1 head, steps, S): model/capture.py's reading
        self.listeners: list[Callable[[Tensor], None]] = []

    def keys(self, memory: Tensor) -> Tensor:
        """The source side of the score for memory (B, S, d): (B, S, d)."""
        if self.key_proj is None:
            return memory
        return linear(memory, self.key_proj.weight)

    def forward(
        self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """query (N, d), keys and memory (B, S, d), mask (B, 1, S) True on real tokens or None
        -> context (N, d) and weights (N, S)."""
        N, d = query.shape
        B, S, _ = memory.shape
        q = query.view(B, N // B, d)  # (B, G, d)
        if self.score == "location":
            w, b = self.location.weight[:S], self.location.bias[:S]
            scores = linear(query, w, b).view(B, -1, S)
        elif self.score == "additive":
            hidden = linear(q, self.query_proj.weight, self.query_proj.bias)  # (B, G, d)
            e = torch.tanh(hidden.unsqueeze(2) + keys.unsqueeze(1))  # (B, G, S, d)
            scores = torch.matmul(e, self.v.to(e.dtype).unsqueeze(-1)).squeeze(-1)  # (B, G, S)
        else:
            scores = torch.matmul(q.contiguous(), keys.transpose(1, 2))  # (B, G, S)
            if self.score == "scaled_dot":
                scores = scores * (1.0 / math.sqrt(d))
        if mask is not None:
            scores = scores.masked_fill(~mask, -torch.inf)
        weights = torch.softmax(scores, dim=-1)
        context = torch.matmul(weights, memory)  # (B, G, d)
        return context.view(N, d), weights.view(N, S)
