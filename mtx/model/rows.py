"""Computations whose rows do not depend on how many rows there are: matrix products, and the
sigmoid.

BLAS libraries compute products with few rows with other kernels than products with many
(on our CPUs: fewer than 12 rows, except 4 and 8), and another kernel sums in another order.
A sentence decoded alone would then get slightly different numbers than in a batch, and a
near-tie between two hypotheses could go either way: the output would depend on the batch.
`linear` pads such products with rows of zeros to MIN_ROWS rows, so that each row is computed
by the same kernel whatever the batch (tests/test_translator.py checks the outcome on all of
Multi30k test2016). Training batches are far larger and never take the padded path, and on
the CPU in fp32 or int8 the search uses packed layers instead, whose rows need no padding
(model/packed.py).

Element-wise functions raise the same question on CPUs with wide vectors. ATen's element-wise
loops run a vector function over whole vectors (8 floats with AVX2, 16 with AVX-512) and leave
the elements after the last pair of vectors to a scalar function; where the two differ, an
element's value depends on where it falls in the tensor, that is on the batch. Two kinds of
operations are safe: IEEE arithmetic (+, -, *, /, which round exactly in any path), and the
transcendental functions that ATen computes with its VML-style routines (exp, tanh, log:
one vector function for every element, the tail loaded as a partial vector). torch.sigmoid is
neither: its scalar path is 1 / (1 + std::exp(-x)), its vector path uses another exp, and a
GRU's gates then differed in the last bits between a sentence alone and in a batch on an
AVX-512 CPU. `sigmoid` here is composed of safe operations only. tests/test_capabilities.py
checks each operation the search uses, and the search itself, under every CPU capability
(`ATEN_CPU_CAPABILITY` default, avx2, avx512) the machine has.
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


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)) from exp, an addition and a division, each of which gives an element
    the same value wherever it falls in the tensor (see above), unlike torch.sigmoid."""
    return torch.reciprocal(torch.exp(-x) + 1.0)


def swish(x: Tensor) -> Tensor:
    """x sigmoid(x) (SiLU), from `sigmoid` above: F.silu's vector and scalar paths differ."""
    return x * sigmoid(x)


# The feed-forward layers' activations (model.activation), each safe in the sense above:
# F.relu and F.gelu (exact, from erf) give an element the same value anywhere (checked with
# the others in tests/test_capabilities.py).
ACTIVATIONS = {"relu": F.relu, "swish": swish, "gelu": F.gelu}
