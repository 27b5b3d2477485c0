"""What every architecture shares: `forward` (what the trainer calls) and the pre-softmax
projection that shares the embedding matrix (paper section 3.4). A model class that
subclasses `EncoderDecoder` has `encode`, `decode`, `embed` (its nn.Embedding), `vocab_size`
and `packed_output`."""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.model.rows import linear


class EncoderDecoder:
    def forward(
        self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None, src_padded: bool = True
    ) -> Tensor:
        """Training: logits (B, T, V) of decoder inputs `tgt_in` (B, T) given sources `src`
        (B, S), or (N, V) at the N flat positions `keep` of (B * T)."""
        memory, src_mask = self.encode(src, src_padded)
        return self.decode(tgt_in, memory, src_mask, keep=keep)

    def output_projection(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., V) logits: the shared embedding matrix as pre-softmax projection."""
        if self.packed_output is None or self.training:
            return linear(x, self.embed.weight)
        flat = x.reshape(-1, x.size(-1))
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed_output, None, "none", [], "")
        return out.view(*x.shape[:-1], self.vocab_size)

    def pack_output_projection(self) -> bool:
        """For inference on CPU in fp32: keep a copy of the output projection in oneDNN's own
        layout. The largest product of a decoding step then runs about twice as fast on our
        CPUs as torch's default BLAS call, and gives every row the same numbers whatever the
        number of rows (tests/test_transformer.py). The copy does not follow later changes of
        the weights (training, `.to()`): call this last. False where it is not available."""
        w = self.embed.weight
        self.packed_output = None
        if (
            w.device.type != "cpu"
            or w.dtype != torch.float32
            or not torch.backends.mkldnn.is_available()
        ):
            return False
        try:
            self.packed_output = torch.ops.mkldnn._reorder_linear_weight(w.detach())
        except (AttributeError, RuntimeError):  # a torch build without the op
            return False
        return True
