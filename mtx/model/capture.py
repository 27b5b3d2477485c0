"""Reading a model's encoder-decoder attention from beside it: which heads are read (`Heads`),
and the weights recorded while the model runs (`capture_cross_attention`).

    with capture_cross_attention(model, [layer]) as seen:
        memory, mask = model.encode(src)
        model.decode(tgt_in, memory, mask)
    weights = seen[layer]  # (B, H, T, S): row t, the attention while reading decoder input t

The model keeps the paper's arguments: each attention module tells its `listeners` the weights
of every forward (model/attention.py, model/rnn_attention.py), and only this module adds and
removes them. With `stop`, the run ends once the last layer asked for has been read (the layers
above it and the output projection never run: what the aligner's forced pass needs); with
`graph`, the weights keep their autograd graph (the guided alignment loss, train/step.py).
While a layer is listened to, training computes its attention written out (the fused kernels
give no weights).

One type describes the heads read, for training and for decoding alike (`Heads`): a layer is
counted from 0, a negative one from the last (-1 the last), and a layer outside the decoder
is refused in one line naming the setting; heads are counted from 0 within the layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from mtx.errors import MtxError
from mtx.model.interface import Decodable

# Where target token t's row is read (decode/align.py): "full", a pass without the causal mask
# (the model's `full_context`), row t; "shift", the translating pass, the row whose decoder
# input is token t (Chen et al. 2020's Shift-Att); "step", the translating pass, the row that
# predicts token t.
Reading = Literal["full", "shift", "step"]


@dataclass(frozen=True)
class Heads:
    """The decoder layer and heads whose encoder-decoder attention is read, and in which pass."""

    layer: int  # as set: from 0, negative from the last
    heads: tuple[int, ...] = ()  # () every head
    guided: bool = False  # the heads guided alignment trained (train.align_*)
    setting: str = "decode.align_layer"  # what names the layer in an error
    reading: Reading = "step"

    @classmethod
    def of(cls, cfg) -> Heads:
        """The heads a model of config `cfg` aligns with: decode.align_heads where named (at
        decode.align_layer), else the guided ones of a model trained with train.align_weight,
        else every head of decode.align_layer; read as decode.align_reading says (auto: a head
        trained in full context at the row that reads the token, which aligned better than in
        a full-context pass on every such model measured; any other at the row that predicts
        it, which aligned far better there than Shift-Att)."""
        t, d = cfg.train, cfg.decode
        asked = None if d.align_reading == "auto" else d.align_reading
        if d.align_heads:
            return cls(d.align_layer, tuple(d.align_heads), reading=asked or "step")
        if t.align_weight > 0:  # a head trained in full context reads best by Shift-Att
            guided = cls.guide(cfg)
            read = asked or ("shift" if guided.reading == "full" else "step")
            return dataclasses.replace(guided, reading=read)
        return cls(d.align_layer, reading=asked or "step")

    @classmethod
    def guide(cls, cfg) -> Heads:
        """The heads guided alignment trains: train.align_layer's first train.align_heads, in
        the pass train.align_context says."""
        t = cfg.train
        reading: Reading = "full" if t.align_context == "full" else "step"
        heads = tuple(range(t.align_heads))
        return cls(t.align_layer, heads, True, "train.align_layer", reading)

    def index(self, layers: int) -> int:
        """The layer from 0 in a decoder of `layers` layers, or MtxError."""
        index = self.layer + layers if self.layer < 0 else self.layer
        if not 0 <= index < layers:
            raise MtxError(
                f"{self.setting} {self.layer}: the decoder has {layers} layer(s) with an "
                f"encoder-decoder attention (0 to {layers - 1}, or -{layers} to -1)"
            )
        return index

    def pick(self, weights: Tensor) -> Tensor:
        """(B, H, T, S) weights of the layer -> those of the heads read (B, h, T, S)."""
        if not self.heads:
            return weights
        if max(self.heads) >= weights.size(1):
            n = weights.size(1)
            name = "train.align_heads" if self.guided else "decode.align_heads"
            raise MtxError(f"{name}: the layer has {n} heads (0 to {n - 1}), not {self.heads}")
        if self.heads == tuple(range(len(self.heads))):  # the first heads: a view
            return weights[:, : len(self.heads)]
        return weights[:, list(self.heads)]


class _Stop(Exception):
    """Raised by a recorder once every layer asked for is read (`stop`)."""


class _Recorder:
    """What a listened-to attention module calls with its weights (no closure, so that
    torch.compile traces it)."""

    def __init__(self, capture: CrossAttention, layer: int) -> None:
        self.capture, self.layer = capture, layer

    def __call__(self, weights: Tensor) -> None:
        c = self.capture
        c.seen[self.layer] = weights if c.graph else weights.detach()
        if c.stop and len(c.seen) == len(c.layers):
            raise _Stop


class CrossAttention:
    """`capture_cross_attention`'s context: the weights read, by layer, in `seen`."""

    def __init__(self, model: Decodable, layers: Sequence[int] | None, stop: bool, graph: bool):
        self.modules = model.cross_attention_modules()
        self.layers = list(range(len(self.modules))) if layers is None else list(layers)
        self.stop, self.graph = stop, graph
        self.seen: dict[int, Tensor] = {}
        self.recorders = [_Recorder(self, i) for i in self.layers]

    def __enter__(self) -> dict[int, Tensor]:
        for i, recorder in zip(self.layers, self.recorders):
            self.modules[i].listeners.append(recorder)
        return self.seen

    def __exit__(self, kind, error, trace) -> bool:
        for i, recorder in zip(self.layers, self.recorders):
            self.modules[i].listeners.remove(recorder)
        return kind is _Stop  # a stopped pass ends quietly


def capture_cross_attention(
    model: Decodable, layers: Sequence[int] | None = None, stop: bool = False, graph: bool = False
) -> CrossAttention:
    """Inside `with`, each forward of the decoder records the encoder-decoder attention of
    `layers` (indices from 0; None: every layer) into the dict it gives, by layer: (B, H, T,
    S), a sentence's beams as rows of their own. `stop`: the forward ends (quietly) once the
    last of `layers` is read. `graph`: the weights keep their autograd graph (else detached)."""
    return CrossAttention(model, layers, stop, graph)
