"""What every architecture shares: `forward` (what the trainer calls) and the pre-softmax
projection that shares the embedding matrix (paper section 3.4). A model class that
subclasses `EncoderDecoder` has `encode`, `decode`, `embed` (its nn.Embedding), `vocab_size`,
`cfg` (its ModelConfig) and `packed_output` (see `pack`), and declares its `capabilities`: it
is a `Decodable` (model/interface.py)."""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.model.interface import Capabilities
from mtx.model.packed import Packable, PackedLinear, available
from mtx.model.rows import linear
from mtx.tokens import SPECIALS, Specials


class EncoderDecoder:
    capabilities: Capabilities
    logits_bias: Tensor | None  # model.output_bias: a bias on the pre-softmax logits, or None
    # Each part (config.PARTS, what train.freeze names): the prefixes of its parameter names.
    PARTS: dict[str, tuple[str, ...]] = {}

    @property
    def max_positions(self) -> int:
        """The longest sequence the model takes (model.max_positions)."""
        return self.cfg.max_positions

    @property
    def specials(self) -> Specials:
        """Its decoder's start token and the ids it never outputs (model.decoder_start)."""
        return SPECIALS[self.cfg.decoder_start]

    def members(self) -> list[EncoderDecoder]:
        """The single models it decodes with: itself."""
        return [self]

    def freeze(self, parts: list[str]) -> int:
        """Stop gradients to the parameters of `parts`; returns how many were frozen."""
        prefixes = tuple(prefix for part in parts for prefix in self.PARTS[part])
        frozen = [p for name, p in self.named_parameters() if name.startswith(prefixes)]
        for p in frozen:
            p.requires_grad_(False)
        return sum(p.numel() for p in frozen)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        keep: Tensor | None = None,
        src_padded: bool = True,
        project: bool = True,
    ) -> Tensor:
        """Training: logits (B, T, V) of decoder inputs `tgt_in` (B, T) given sources `src`
        (B, S), or (N, V) at the N flat positions `keep` of (B * T); with `project` False, the
        output states that `output_weight()` projects (for train/loss.py's output_loss)."""
        memory, src_mask = self.encode(src, src_padded)
        x = self.states(tgt_in, memory, src_mask)  # (B, T, d)
        if keep is not None:
            x = x.flatten(0, 1).index_select(0, keep)  # (N, d)
        return self.output_projection(x) if project else x

    def output_weight(self) -> Tensor:
        """(V, d) the pre-softmax projection: the shared embedding matrix."""
        return self.embed.weight

    def output_bias(self) -> Tensor | None:
        """(V,) the bias added to the logits (model.output_bias), or None."""
        return self.logits_bias

    def output_projection(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., V) logits: the shared embedding matrix as pre-softmax projection
        (plus the output bias, if any)."""
        if self.packed_output is None or self.training:
            return linear(x, self.output_weight(), self.output_bias())
        return self.packed_output(x)

    def pack(self, kind: str | None) -> bool:
        """Prepare the linear layers (the attention and feed-forward layers and the output
        projection) for inference on the CPU in `kind`, "fp32" or "int8" (model/packed.py), or
        drop the prepared copies (None). The copies do not follow later changes of the
        weights (training, `.to()`): call this last. False, with nothing prepared, where the
        model is not on the CPU in fp32 or torch lacks the kernels."""
        layers = [m for m in self.modules() if isinstance(m, Packable)]
        for module in layers:
            module.pack(None)
        self.packed_output = None
        w = self.embed.weight
        if (
            kind is None
            or w.device.type != "cpu"
            or w.dtype != torch.float32
            or not available(kind)
        ):
            return False
        for module in layers:
            module.pack(kind)
        self.packed_output = PackedLinear(w, self.output_bias(), kind)
        return True
