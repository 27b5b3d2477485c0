"""The model section: the network (model/), the paper's Transformer, its variants, or the
recurrent baseline."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from mtx.config.fields import FRACTION, NOT_NEGATIVE, POSITIVE, setting
from mtx.errors import MtxError

Part = Literal["embeddings", "encoder", "decoder"]  # what train.freeze names (each model's parts)
PARTS: tuple[str, ...] = typing.get_args(Part)
AttentionScore = Literal["additive", "general", "dot", "scaled_dot", "location"]
ATTENTION_SCORES: tuple[str, ...] = typing.get_args(AttentionScore)


@dataclass
class ModelConfig:
    """The network (model/): the paper's Transformer, its variants, or the recurrent baseline."""

    d_model: int = setting(512, "model width", POSITIVE)
    d_ff: int = setting(2048, "inner width of the position-wise feed-forward network", POSITIVE)
    n_heads: int = setting(8, "attention heads; d_k = d_v = d_model / n_heads", POSITIVE)
    encoder_layers: int = setting(6, "encoder stack depth", POSITIVE)
    decoder_layers: int = setting(6, "decoder stack depth", POSITIVE)
    decoder_d_ff: int = setting(
        0,
        "feed-forward inner width of the decoder layers (0: d_ff); students narrow it",
        NOT_NEGATIVE,
    )
    decoder_self: Literal["attention", "ssru"] = setting(
        "attention",
        "how a decoder layer reads the positions before it: self-attention (the paper) or an "
        "SSRU, a simpler simple recurrent unit (Kim et al. 2019; fast students' decoders)",
    )
    output_bias: bool = setting(
        False,
        "a trained bias on the pre-softmax logits (the paper has none; MarianMT's "
        "final_logits_bias)",
    )
    activation: Literal["relu", "swish", "gelu"] = setting(
        "relu",
        "the feed-forward layers' activation: relu (the paper), swish (x sigmoid(x), OPUS-MT's "
        "MarianMT models) or gelu (the exact, erf form: NLLB's)",
    )
    decoder_start: Literal["bos", "pad", "eos"] = setting(
        "bos",
        "the decoder's first input: bos (mtx's vocabularies), pad (an imported MarianMT model: "
        "its vocabulary has no BOS, id 2 is a piece) or eos (an imported NLLB model)",
    )
    dropout: float = setting(
        0.1, "on sublayer outputs and on embedding + position sums (the paper's)", FRACTION
    )
    attention_dropout: float = setting(0.0, "on attention weights (not in the paper)", FRACTION)
    init: Literal["fairseq", "xavier"] = setting(
        "fairseq",
        "Transformer weights: fairseq (Q/K/V Xavier with gain 1/sqrt(2), feed-forward layers "
        "and Q/K/V biases as torch's nn.Linear; it learns more per update) or xavier (every "
        "matrix Xavier, zero biases); the paper does not say",
    )
    max_positions: int = setting(
        1024, "length of the position table (the longest sequence)", POSITIVE
    )
    layer_norm_eps: float = setting(1e-5, "LayerNorm epsilon", POSITIVE)
    norm: Literal["post", "pre"] = setting(
        "post", "residual placement: post (the paper: LN(x + f(x))) or pre (x + f(LN(x)))"
    )
    positions: Literal["sinusoidal", "fairseq", "learned", "relative"] = setting(
        "sinusoidal",
        "sinusoidal (the paper), fairseq (fairseq's sinusoidal table, counted from 2: NLLB's), "
        "learned, or relative (Shaw et al.)",
    )
    max_relative_position: int = setting(
        16, "relative positions: distances clipped to [-k, k]", NOT_NEGATIVE
    )
    arch: Literal["transformer", "rnn"] = setting(
        "transformer",
        "transformer (the paper) or rnn (an attentional RNN, Luong et al., which uses d_model, "
        "the layer counts, dropout and max_positions, and the rnn_* and attention keys)",
    )
    rnn_cell: Literal["lstm", "gru"] = setting("lstm", "rnn: the recurrent cell")
    attention: AttentionScore = setting("general", "rnn: how attention scores are computed")

    def check(self) -> None:
        m = self
        if m.arch == "transformer" and m.d_model % m.n_heads:
            raise MtxError(
                f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})"
            )
        if m.arch != "rnn":
            return
        if m.d_model % 2:
            raise MtxError(
                f"model.d_model ({m.d_model}) must be even with model.arch rnn (each "
                "direction of the bidirectional encoder has d_model / 2 units)"
            )
        transformer = ("norm", "positions", "init", "decoder_d_ff", "decoder_self", "activation")
        for key in (*transformer, "output_bias"):
            value, default = getattr(m, key), getattr(ModelConfig, key)
            if value != default:
                raise MtxError(f"model.{key} ({value}) is a transformer setting; model.arch is rnn")
