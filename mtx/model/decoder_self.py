"""How a decoder layer reads the positions before it (`model.decoder_self`): every kind
registered here, once, with all that the rest of mtx needs to know of it.

- `attention`: the paper's masked multi-head self-attention (attention.py); its cache keeps
  every position's keys and values.
- `ssru`: a simpler simple recurrent unit (ssru.py; Kim et al. 2019), fast students'
  decoders; its cache keeps one cell of d_model per hypothesis.

A kind says how to build its sublayer, whether it is a recurrence (causal by construction,
called `module(h, cache)`, its state a cell of `state_width` in the decoder cache) or
attention-like (called `module(h, mask=, causal=, cache=)`, keys and values in the cache), its
forward FLOPs (model/flops.py), a description (`mtx info`) and the export formats that hold
it (mtx/formats refuses the others). The layer (layers.py), the caches' allocation
(transformer.py), the FLOPs, `mtx info` and the exports read it from `DECODER_SELF`; a kind
added here is decoded by both searches and trained as any other (tests/test_decoder_self.py
adds one). Settable from a config once `model.decoder_self`'s choices (config.py) name it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from mtx.config import ModelConfig
from mtx.model.attention import MultiHeadAttention
from mtx.model.positions import relative_distance
from mtx.model.ssru import SSRU


@dataclass(frozen=True)
class SelfKind:
    """One kind of decoder self-sublayer."""

    label: str  # its name in messages: "the --format X has no LABEL decoder layer"
    description: str  # what `mtx info` says of a model with it ("" for the paper's)
    build: Callable[[ModelConfig], nn.Module]  # the sublayer of one decoder layer
    recurrent: bool  # a recurrence: causal by construction, keeps a cell, not keys and values
    state_width: Callable[[ModelConfig], int]  # a recurrent kind's cell width per hypothesis
    flops: Callable[[ModelConfig, int, int], int]  # forward FLOPs over T positions, R distances
    exports: tuple[str, ...]  # the `mtx export --format`s that hold it


def _attention(cfg: ModelConfig) -> nn.Module:
    return MultiHeadAttention(
        cfg.d_model, cfg.n_heads, cfg.attention_dropout,
        max_relative_position=relative_distance(cfg), init=cfg.init,
    )  # fmt: skip


def _attention_flops(cfg: ModelConfig, T: int, R: int) -> int:
    d = cfg.d_model
    return 4 * 2 * d * d * T + 2 * 2 * T * T * d + 2 * 2 * T * R * d  # q,k,v,o; scores; relative


DECODER_SELF: dict[str, SelfKind] = {
    "attention": SelfKind(
        label="self-attention",
        description="",
        build=_attention,
        recurrent=False,
        state_width=lambda cfg: 0,
        flops=_attention_flops,
        exports=("hf", "ctranslate2"),
    ),
    "ssru": SelfKind(
        label="SSRU",
        description="SSRU decoder layers",
        build=lambda cfg: SSRU(cfg.d_model, cfg.init),
        recurrent=True,
        state_width=lambda cfg: cfg.d_model,
        flops=lambda cfg, T, R: 2 * 2 * cfg.d_model * cfg.d_model * T,  # gate's, input's products
        exports=(),
    ),
}


def decoder_self(cfg: ModelConfig) -> SelfKind:
    """The kind `model.decoder_self` names."""
    if cfg.decoder_self not in DECODER_SELF:
        raise ValueError(
            f"model.decoder_self {cfg.decoder_self!r} is no registered kind "
            f"({', '.join(DECODER_SELF)})"
        )
    return DECODER_SELF[cfg.decoder_self]
