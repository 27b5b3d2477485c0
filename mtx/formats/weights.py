"""The weights of an encoder-decoder Transformer under MarianMT's names, which M2M100 (NLLB)
shares: one map serving both directions of both formats (marian.py, m2m100.py).

Marian's position table puts the d/2 sines first and the d/2 cosines after them, where the
paper (and mtx) interleave them: Marian's table is ours with its dimensions permuted, so a
post-norm model's weights are permuted the same way (`marian_permutation`); M2M100 builds
fairseq's table, read in the model dimension's own order. Our one (3d, d) `in_proj` is
q_proj, k_proj, v_proj.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.config import ModelConfig
from mtx.errors import MtxError
from mtx.model.transformer import Transformer

MARIAN_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which MarianMT always uses


def marian_permutation(d_model: int) -> Tensor:
    """Index p with marian_vector = our_vector[p]: our even (sine) dimensions, then the odd."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _layer_names(cfg: ModelConfig) -> list[tuple[str, str, str]]:
    """(our attention, MarianMT's) of every attention, and (our name, MarianMT's, where the
    model dimension lies: "rows", "cols" or "" for none) of every other weight but the
    embeddings: the one name map of the export and the import."""
    attentions, weights = [], []

    def norm(dst: str, src: str) -> None:
        weights.extend(
            [(f"{src}.weight", f"{dst}.weight", "rows"), (f"{src}.bias", f"{dst}.bias", "rows")]
        )

    def ffn(dst: str, src: str) -> None:
        weights.extend(
            [
                (f"{src}.ffn.fc1.weight", f"{dst}.fc1.weight", "cols"),
                (f"{src}.ffn.fc1.bias", f"{dst}.fc1.bias", ""),
                (f"{src}.ffn.fc2.weight", f"{dst}.fc2.weight", "rows"),
                (f"{src}.ffn.fc2.bias", f"{dst}.fc2.bias", "rows"),
            ]
        )

    def attention(dst: str, src: str) -> None:
        attentions.append((src, dst))
        weights.extend(
            [
                (f"{src}.out_proj.weight", f"{dst}.out_proj.weight", "rows"),
                (f"{src}.out_proj.bias", f"{dst}.out_proj.bias", "rows"),
            ]
        )

    for i in range(cfg.encoder_layers):
        dst, src = f"model.encoder.layers.{i}", f"encoder_layers.{i}"
        attention(f"{dst}.self_attn", f"{src}.self_attn")
        norm(f"{dst}.self_attn_layer_norm", f"{src}.self_attn_norm")
        ffn(dst, src)
        norm(f"{dst}.final_layer_norm", f"{src}.ffn_norm")
    for i in range(cfg.decoder_layers):
        dst, src = f"model.decoder.layers.{i}", f"decoder_layers.{i}"
        attention(f"{dst}.self_attn", f"{src}.self_attn")
        norm(f"{dst}.self_attn_layer_norm", f"{src}.self_attn_norm")
        attention(f"{dst}.encoder_attn", f"{src}.cross_attn")
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}.cross_attn_norm")
        ffn(dst, src)
        norm(f"{dst}.final_layer_norm", f"{src}.ffn_norm")
    return [(a, b, "attention") for a, b in attentions] + weights


def _permuted(t: Tensor, where: str, p: Tensor) -> Tensor:
    return t[p] if where == "rows" else t[:, p] if where == "cols" else t


EMBEDDINGS = ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head")


QKV = ("q_proj", "k_proj", "v_proj")


def marian_state_dict(
    model: Transformer, origin: list[int], permute: bool = True
) -> dict[str, Tensor]:
    """Our weights under MarianMTModel's names, the model dimension permuted (see module doc)
    and the vocabulary in MarianMT's order (`origin`: the MarianMT id of each of ours). With
    `permute` False, M2M100's (an imported NLLB model's: fairseq's positions in their own
    order, each stack's final norm, no final_logits_bias)."""
    d = model.cfg.d_model
    p = marian_permutation(d) if permute else torch.arange(d)
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out: dict[str, Tensor] = {}
    for src, dst, where in _layer_names(model.cfg):
        if where == "attention":
            w, b = ours[f"{src}.in_proj.weight"][:, p], ours[f"{src}.in_proj.bias"]
            for i, name in enumerate(QKV):
                out[f"{dst}.{name}.weight"] = w[i * d : (i + 1) * d]
                out[f"{dst}.{name}.bias"] = b[i * d : (i + 1) * d]
        else:
            out[dst] = _permuted(ours[src], where, p)
    order = torch.argsort(torch.tensor(origin))  # our id of each MarianMT id
    embed = ours["embed.weight"][order][:, p]
    for name in EMBEDDINGS:
        out[f"{name}.weight"] = embed
    if not permute:
        for stack in ("encoder", "decoder"):
            for part in ("weight", "bias"):
                out[f"model.{stack}.layer_norm.{part}"] = ours[f"{stack}_norm.{part}"]
        return out
    bias = model.output_bias()  # model.output_bias, else Marian's zeros
    bias = torch.zeros(model.vocab_size) if bias is None else bias.detach().float().cpu()
    out["final_logits_bias"] = bias[order][None]
    return out


def from_marian_state_dict(
    weights: dict[str, Tensor], cfg: ModelConfig, origin: list[int], permute: bool = True
) -> dict[str, Tensor]:
    """MarianMTModel's weights under our names (the inverse of `marian_state_dict`): our id
    i's rows are MarianMT id origin[i]'s, the model dimension in our interleaved order. M2M100
    (NLLB) names its layers' weights as MarianMT does; its positions are fairseq's table, read
    in its own order (`permute` False), and its stacks' final norms are mapped here too."""
    if permute:  # our dimension j is Marian's back[j]
        back = torch.argsort(marian_permutation(cfg.d_model))
    else:
        back = torch.arange(cfg.d_model)
    ours: dict[str, Tensor] = {}
    for src, dst, where in _layer_names(cfg):
        if where == "attention":
            w = torch.cat([weights[f"{dst}.{n}.weight"] for n in QKV])
            ours[f"{src}.in_proj.weight"] = w[:, back]
            ours[f"{src}.in_proj.bias"] = torch.cat([weights[f"{dst}.{n}.bias"] for n in QKV])
        else:
            ours[src] = _permuted(weights[dst], where, back)
    ours["embed.weight"] = weights["model.shared.weight"][origin][:, back]
    if cfg.norm == "pre":  # M2M100's stack norms
        for stack in ("encoder", "decoder"):
            for part in ("weight", "bias"):
                ours[f"{stack}_norm.{part}"] = weights[f"model.{stack}.layer_norm.{part}"][back]
    if cfg.output_bias:
        ours["logits_bias"] = weights["final_logits_bias"][0][origin]
    return {k: v.float().contiguous() for k, v in ours.items()}


def load_into(hf, weights: dict[str, Tensor], family: str):
    """`hf` (a transformers model) holding `weights`, every one of its weights named there but
    its built position table; refused if this transformers version names them otherwise."""
    expected = hf.state_dict()
    positions = {k for k in expected if "embed_positions" in k}
    missing = set(expected) - set(weights) - positions
    unexpected = set(weights) - set(expected)
    if missing or unexpected:  # a transformers version with other names: fail loudly
        raise MtxError(
            f"this transformers version names {family}'s weights differently "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    with torch.no_grad():
        for name, tensor in weights.items():
            expected[name].copy_(tensor)
    return hf
