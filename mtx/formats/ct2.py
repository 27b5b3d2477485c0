"""`mtx export --format ctranslate2`: a checkpoint as a CTranslate2 model directory.

The weights go into CTranslate2's own `TransformerSpec` through its `Converter` base class,
which validates, optionally quantizes (int8, float16, ...) and writes the model, as its
OpenNMT-py and fairseq converters do. The spec expresses our model as it is: post-norm
(or pre-norm with each stack's final LayerNorm: an imported NLLB model's), its activation,
sqrt(d)-scaled shared embeddings, its position table given as the position encodings (our
interleaved sinusoids, or fairseq's), the fused (3d, d) query/key/value matrix, the decoder
starting from its start token (<s>; an imported model's <pad> or </s>). An NLLB model's caller
passes the source language's code first in the source and the target's as `target_prefix`.
The source EOS is added by CTranslate2 (add_source_eos), so callers pass SentencePiece pieces.

(Going through the Hugging Face export and `ct2-transformers-converter` would not be exact:
that converter assumes Marian's decoder starts from a zero embedding, ours from BOS.)
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from mtx.config import Config
from mtx.data import vocab
from mtx.errors import MtxError
from mtx.model.transformer import Transformer

QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)


# model.activation -> CTranslate2's Activation member (GELU: the exact, erf form)
CT2_ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}


def _np(t: Tensor):
    return t.detach().float().cpu().contiguous().numpy()


def transformer_spec(model: Transformer, spm_proto: bytes):
    from ctranslate2.specs import common_spec, transformer_spec

    m = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (m.encoder_layers, m.decoder_layers),
        m.n_heads,
        pre_norm=m.norm == "pre",
        activation=common_spec.Activation[CT2_ACTIVATIONS[m.activation]],
    )
    spec.config.layer_norm_epsilon = m.layer_norm_eps
    spec.config.add_source_eos = True
    v = vocab.load(spm_proto)
    spec.config.decoder_start_token = v.id_to_piece(model.specials.start)  # <s>, <pad>, </s>
    w = {k: _np(v) for k, v in model.state_dict().items()}
    positions = _np(model.positions)
    d = m.d_model

    def linear(dst, name: str, rows: slice = slice(None)) -> None:
        dst.weight = w[f"{name}.weight"][rows]
        dst.bias = w[f"{name}.bias"][rows]

    def norm(dst, name: str) -> None:
        dst.gamma, dst.beta = w[f"{name}.weight"], w[f"{name}.bias"]

    def ffn(dst, name: str) -> None:
        linear(dst.linear_0, f"{name}.ffn.fc1")
        linear(dst.linear_1, f"{name}.ffn.fc2")
        norm(dst.layer_norm, f"{name}.ffn_norm")

    for stack, name in ((spec.encoder, "encoder_norm"), (spec.decoder, "decoder_norm")):
        stack.position_encodings.encodings = positions  # ours, or fairseq's (NLLB's)
        stack.scale_embeddings = True
        if m.norm == "pre":  # each stack's last LayerNorm
            norm(stack.layer_norm, name)
    spec.encoder.embeddings[0].weight = w["embed.weight"]
    spec.decoder.embeddings.weight = w["embed.weight"]
    spec.decoder.projection.weight = w["embed.weight"]
    if "logits_bias" in w:  # model.output_bias
        spec.decoder.projection.bias = w["logits_bias"]
    for i, layer in enumerate(spec.encoder.layer):
        name = f"encoder_layers.{i}"
        linear(layer.self_attention.linear[0], f"{name}.self_attn.in_proj")
        linear(layer.self_attention.linear[1], f"{name}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{name}.self_attn_norm")
        ffn(layer.ffn, name)
    for i, layer in enumerate(spec.decoder.layer):
        name = f"decoder_layers.{i}"
        linear(layer.self_attention.linear[0], f"{name}.self_attn.in_proj")
        linear(layer.self_attention.linear[1], f"{name}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{name}.self_attn_norm")
        linear(layer.attention.linear[0], f"{name}.cross_attn.in_proj", slice(0, d))
        linear(layer.attention.linear[1], f"{name}.cross_attn.in_proj", slice(d, 3 * d))
        linear(layer.attention.linear[2], f"{name}.cross_attn.out_proj")
        norm(layer.attention.layer_norm, f"{name}.cross_attn_norm")
        ffn(layer.ffn, name)
    pieces = [v.id_to_piece(i) for i in range(v.get_piece_size())]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def export_ct2(
    model: Transformer, cfg: Config, spm_proto: bytes, out: Path, quantization: str | None
) -> None:
    try:
        from ctranslate2.converters.converter import Converter
    except ImportError:
        raise MtxError(
            "--format ctranslate2 needs the ctranslate2 package: pip install 'mtx[export]'"
        ) from None
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise MtxError(
            f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )

    class MtxConverter(Converter):
        def _load(self):
            return transformer_spec(model, spm_proto)

    MtxConverter().convert(str(out), quantization=quantization, force=True)
    v = vocab.load(spm_proto)
    if isinstance(v, vocab.Joint):
        (out / "spm.model").write_bytes(spm_proto)
    else:  # an imported model's two SentencePiece models (their pieces: the vocabulary's)
        for name, proto in zip(("source.spm", "target.spm"), v.models):
            (out / name).write_bytes(proto)
