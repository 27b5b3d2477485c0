"""`train.precision: bf16-weights`: the step computes with bf16 weights; Adam keeps fp32 ones.

Autocast (`bf16`) keeps fp32 weights and casts each one to bf16 where an operation uses it:
on an H100 an eager update spent much of its time on those casts (BENCHMARKS.md), as
NVIDIA's Transformer README found for fp16 (per-op casting slower than fp16 weights with fp32
master copies). Here the step runs a bf16 working copy of the model: weights,
activations and gradients in bf16, the loss's softmax and sums in fp32 (loss.py). After the
backward pass the gradients are copied into the fp32 model as fp32, clipped, and Adam updates
the fp32 weights; the working copy is then set to them, rounded to bf16.

The fp32 model stays what every other part sees: checkpoints save it (a resumed run is exact,
the fp32 weights never pass through bf16), validation and translation read it, fine-tuning
loads into it. Small updates are not lost to bf16's 8-bit mantissa: they accumulate in fp32.
"""

from __future__ import annotations

import copy

import torch


class MasterWeights:
    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        """`model` (fp32, weights loaded and parts frozen) stays the master; `work` is its
        copy in `dtype`, what the step runs."""
        self.master = model
        self.work = copy.deepcopy(model).to(dtype)
        pairs = zip(self.work.parameters(), model.parameters())
        self.pairs = [(w, m) for w, m in pairs if m.requires_grad]

    def take_grads(self) -> None:
        """The working copy's gradients into the master's, as fp32 (None where it has none)."""
        for w, m in self.pairs:
            m.grad = None if w.grad is None else w.grad.float()
            w.grad = None

    def clear_grads(self) -> None:
        """Drop the working copy's gradients (of an update that did not finish)."""
        for w, _ in self.pairs:
            w.grad = None

    @torch.no_grad()
    def give_weights(self) -> None:
        """The working copy set to the master's weights (every parameter: frozen ones too, after
        a checkpoint is loaded into the master), rounded to its dtype."""
        work, master = list(self.work.parameters()), list(self.master.parameters())
        torch._foreach_copy_(work, master)
