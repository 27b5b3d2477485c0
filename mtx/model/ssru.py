"""The SSRU, a simpler simple recurrent unit (Kim et al. 2019, "From Research to Production and
Back: Ludicrously Fast Neural Machine Translation", section 3.1), in place of a decoder layer's
self-attention (`model.decoder_self: ssru`).

Shape legend: B rows (sentences, or hypotheses when decoding), T positions, d = d_model.

    f_t = sigmoid(W_f x_t + b_f)                 (forget gate)
    c_t = f_t * c_{t-1} + (1 - f_t) * W x_t      (cell, c_0 = 0)
    o_t = ReLU(c_t)

A decoding step then costs two d x d products and a few element-wise operations, whatever the
length decoded so far, where self-attention reads every earlier position's keys and values.
W_f and W are one (2d, d) product (the paper's W x has no bias). Training runs the recurrence
position by position, as decoding does, with the same operations, each of them one whose
elements do not depend on the batch (model/rows.py: its sigmoid, not torch's; no fused
multiply-add). The cell of the positions decoded so far lives in the decoder cache
(model/cache.py), one row per hypothesis. The recurrence runs in float32 (at least) whatever
the products' precision (bf16 on a GPU), so that rounding does not pile up along the
positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtx.model.cache import LayerCache
from mtx.model.packed import Packable
from mtx.model.rows import sigmoid


class SSRU(Packable, nn.Module):
    def __init__(self, d_model: int, init: str = "fairseq") -> None:
        super().__init__()
        self.init = init
        self.proj = nn.Linear(d_model, 2 * d_model, bias=False)  # [W_f; W]
        self.gate_bias = nn.Parameter(torch.zeros(d_model))  # b_f
        self.linear_names, self.packed = ("proj",), {}  # see Packable
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """`init` "fairseq": nn.Linear's uniform weights; "xavier": Xavier-uniform for W_f and
        W each. b_f = 0: each gate starts near 1/2."""
        d = self.gate_bias.numel()
        if self.init == "fairseq":
            self.proj.reset_parameters()
        else:
            for part in (self.proj.weight[:d], self.proj.weight[d:]):
                nn.init.xavier_uniform_(part)
        nn.init.zeros_(self.gate_bias)

    def linear_layer(self, name: str) -> tuple[Tensor, Tensor | None, str | None]:
        return self.proj.weight, None, None

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d). With `cache`, x holds the positions after those cached:
        the recurrence starts from the cached cell and leaves its last cell there."""
        h = self.project("proj", x)
        gate, inputs = h.to(torch.promote_types(h.dtype, torch.float32)).chunk(2, dim=-1)
        forget = sigmoid(gate + self.gate_bias.to(gate.dtype))
        update = (1 - forget) * inputs
        cell = None if cache is None else cache.cell()
        if cell is None:
            cell = torch.zeros_like(update[:, 0])
        cells = []
        for t in range(x.size(1)):
            cell = forget[:, t] * cell + update[:, t]
            cells.append(cell)
        if cache is not None:
            cache.keep_cell(cell, x.size(1))
        return torch.relu(torch.stack(cells, dim=1)).to(x.dtype)
