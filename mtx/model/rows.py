"""Matrix products whose rows do not depend on how many rows there are.

BLAS libraries compute products with few rows with other kernels than products with many
(on our CPUs: fewer than 12 rows, except 4 and 8), and another kernel sums in another order.
A sentence decoded alone would then get slightly different numbers than in a batch, and a
near-tie between two hypotheses could go either way: the output would depend on the batch.
`linear` pads such products with rows of zeros to MIN_ROWS rows, so that each row is computed
by the same kernel whatever the batch (tests/test_translator.py checks the outcome on all of
Multi30k test2016). Training batches are far larger and never take the padded path, and on
the CPU in fp32 or int8 the search uses packed layers instead, whose rows need no padding
(model/packed.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_ROWS = 16


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias), computed with at least MIN_ROWS rows."""
    rows = x.numel() // x.size(-1)
    if rows >= MIN_ROWS:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.size(-1))
    padded = torch.cat([flat, flat.new_zeros(MIN_ROWS - rows, x.size(-1))])
    return F.linear(padded, weight, bias)[:rows].view(*x.shape[:-1], weight.size(0))
