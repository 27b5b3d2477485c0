"""Linear layers prepared once for inference on a CPU: `decode.dtype` fp32 or int8.

A decoding step multiplies a few rows (sentences x beams) by every weight matrix of the
decoder, so on a CPU its time goes mostly into reading weights and into the fixed cost of
small products. Preparing each weight once for the kernel that reads it fastest makes these
products about twice as fast, and both kinds below give each row the same numbers whatever
the number of rows, with no padding (model/rows.py says why that matters):

- "fp32": the weight in oneDNN's blocked layout (torch's `mkldnn._linear_pointwise`, the
  kernel that inductor's freezing uses), with the ReLU of the feed-forward layer fused.
- "int8": weights quantized per output row (symmetric, scale = max |w| / 127) and run by
  fbgemm's dynamically quantized product, a quarter of the weight memory. fbgemm quantizes
  its input with one scale and zero point for the whole matrix, found from its minimum and
  maximum, so a row's numbers would depend on the other rows. Here each row is first divided
  by its own largest magnitude m, and two rows of +1 and -1 are appended: the whole matrix
  then always spans [-1, 1], every batch gets the same quantization parameters, and the
  integer products are exact. The output row is multiplied back by m, and the bias added.
  Inputs use 7 bits (fbgemm's `reduce_range`), so that no 16-bit partial sum saturates on
  AVX2 CPUs.

Packed weights are copies: they do not follow later changes of the weights (training,
`.to()`), and the modules use them only in eval mode.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from mtx.model.rows import ACTIVATIONS, linear

KINDS = ("fp32", "int8")


def available(kind: str) -> bool:
    """Whether this torch build has the kernels of `kind`."""
    if kind == "fp32":
        return torch.backends.mkldnn.is_available()
    return any(e in torch.backends.quantized.supported_engines for e in ("fbgemm", "x86"))


class PackedLinear:
    """F.linear(x, weight, bias), then `activation` (a name in rows.ACTIVATIONS, or None), for
    CPU inference with a weight prepared for `kind`. x (..., in) float32 -> (..., out)
    float32. oneDNN applies a ReLU within the product; another activation follows it."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, kind: str, activation: str | None = None
    ):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        weight = weight.detach().float().contiguous()
        self.kind, self.activation, self.out_features = kind, activation, weight.size(0)
        self.bias = None if bias is None else bias.detach().float().contiguous()
        if kind == "fp32":
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight)
            return
        scale = (weight.abs().amax(1) / 127).clamp(min=1e-12).double()
        zero = torch.zeros(weight.size(0), dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated; their ops are not
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
            self.weight = torch.ops.quantized.linear_prepack(qweight, None)
        self.bounds = torch.stack([torch.ones(weight.size(1)), -torch.ones(weight.size(1))])

    def __call__(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.size(-1))
        fused = self.kind == "fp32" and self.activation == "relu"
        if self.kind == "fp32":
            post = "relu" if fused else "none"
            out = torch.ops.mkldnn._linear_pointwise(flat, self.weight, self.bias, post, [], "")
        else:
            # each row's largest magnitude, exactly (abs then amax: 5 to 8 times faster than
            # vector_norm(inf), which took as long as the int8 product: BENCHMARKS.md)
            m = flat.abs().amax(1, keepdim=True).clamp(min=1e-30)
            spanned = torch.cat([flat / m, self.bounds])
            out = torch.ops.quantized.linear_dynamic(spanned, self.weight, True)[: flat.size(0)]
            out = out * m if self.bias is None else torch.addcmul(self.bias, out, m)
        if self.activation is not None and not fused:
            out = ACTIVATIONS[self.activation](out)
        return out.view(*x.shape[:-1], self.out_features)


class Packable:
    """Mixin for a module whose linear layers can be packed. `linear_layer(name)` gives one's
    weight, bias and the activation that follows it (None: none); `pack(kind)` prepares those named in
    `linear_names`; `project(name, x)` applies one: packed in eval mode once prepared, else
    F.linear with padded rows (model/rows.py)."""

    linear_names: tuple[str, ...]
    packed: dict[str, PackedLinear]
    training: bool

    def linear_layer(self, name: str) -> tuple[Tensor, Tensor | None, str | None]:
        raise NotImplementedError

    def pack(self, kind: str | None) -> None:
        """Prepare every linear layer for `kind`, or drop the prepared copies (None)."""
        self.packed = {}
        for name in () if kind is None else self.linear_names:
            weight, bias, activation = self.linear_layer(name)
            self.packed[name] = PackedLinear(weight, bias, kind, activation)

    def project(self, name: str, x: Tensor) -> Tensor:
        """Linear layer `name` on x (then its activation)."""
        packed = None if self.training else self.packed.get(name)
        if packed is not None:
            return packed(x)
        weight, bias, activation = self.linear_layer(name)
        out = linear(x, weight, bias)
        return out if activation is None else ACTIVATIONS[activation](out)
