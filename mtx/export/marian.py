"""`mtx export --format hf`: a checkpoint as a Hugging Face `MarianMTModel` + `MarianTokenizer`.

MarianMT is the same post-norm encoder-decoder as ours (shared, sqrt(d)-scaled embeddings tied
to the output projection, ReLU feed-forward, sinusoidal positions, no final stack norms), with
two differences that the export maps exactly:

- Positional table layout. The paper (and mtx) interleave sines and cosines:
  PE(pos, 2i) = sin, PE(pos, 2i+1) = cos. Marian puts the d/2 sines first and the d/2 cosines
  after them, with the same frequencies, and always builds its own table (it is not read from
  the weights). Marian's table is ours with its dimensions permuted, so the export permutes
  the model dimension of every weight the same way: embeddings and matrices reading the
  residual stream by column, matrices writing it by row, LayerNorm gains and biases. LayerNorm
  and dot products do not change under a permutation, so the permuted model computes the same
  logits.
- Attention weights: our one (3d, d) `in_proj` becomes Marian's q_proj, k_proj, v_proj.

Marian's `final_logits_bias` is the model's output bias (`model.output_bias`), or zeros; the
decoder starts from the model's start token (decoder_start_token_id: our BOS, or an imported
model's PAD). An imported model (mtx/pretrained/marian.py, which uses this module's name map
backwards) goes back out with its own ids, SentencePiece models and vocab.json.
What Marian cannot express (another LayerNorm epsilon than its fixed 1e-5) is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from mtx.config import Config, ModelConfig
from mtx.data import vocab
from mtx.decode import rules
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokens import EOS_ID, PAD_ID, Specials

MARIAN_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which MarianMT always uses


def marian_permutation(d_model: int) -> Tensor:
    """Index p with marian_vector = our_vector[p]: our even (sine) dimensions, then the odd."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def check_exportable(cfg: Config) -> None:
    m = cfg.model
    if m.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        raise MtxError(
            f"model.layer_norm_eps is {m.layer_norm_eps}, but MarianMT's LayerNorm epsilon is "
            f"fixed at {MARIAN_LAYER_NORM_EPS}: this model cannot be exported to --format hf"
        )
    if m.d_model % 2:
        raise MtxError(f"model.d_model ({m.d_model}) must be even for Marian's position table")


def marian_ids(specials: Specials, origin: list[int]) -> dict[str, int]:
    """MarianMT's special ids of a model whose id i is MarianMT's origin[i] (an imported
    model's vocabulary keeps its own ids; mtx's own maps onto itself)."""
    start = origin[specials.start]
    return {
        "pad_token_id": origin[PAD_ID],
        "eos_token_id": origin[EOS_ID],
        "decoder_start_token_id": start,
        # a vocabulary without BOS (an imported MarianMT one) names EOS, as OPUS-MT's do
        "bos_token_id": origin[EOS_ID] if specials.start == PAD_ID else start,
        "forced_eos_token_id": origin[EOS_ID],
    }


def marian_config(cfg: Config, vocab_size: int, ids: dict[str, int]):
    from transformers import MarianConfig

    m = cfg.model
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=m.d_model,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.decoder_d_ff or m.d_ff,
        max_position_embeddings=m.max_positions,
        activation_function=m.activation,  # relu, swish and gelu: transformers' names too
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        **ids,
    )


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


def to_marian(model: Transformer, cfg: Config, origin: list[int] | None = None):
    """A `transformers.MarianMTModel` (eval mode) computing the same logits as `model`, its
    ids MarianMT's `origin` of ours (None: ours)."""
    from transformers import MarianMTModel

    check_exportable(cfg)
    origin = list(range(model.vocab_size)) if origin is None else origin
    ids = marian_ids(model.specials, origin)
    hf = MarianMTModel(marian_config(cfg, model.vocab_size, ids)).eval()
    return load_into(hf, marian_state_dict(model, origin), "MarianMT")


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


def export_hf(model: Transformer, cfg: Config, spm_proto: bytes, out: Path) -> None:
    """Write a directory that `MarianMTModel.from_pretrained` and
    `MarianTokenizer.from_pretrained` load offline (an imported model's with its own ids,
    SentencePiece models and vocab.json)."""
    from transformers import GenerationConfig, MarianTokenizer

    v = vocab.load(spm_proto)
    hf = to_marian(model, cfg, v.origin)
    ids = marian_ids(model.specials, v.origin)
    d = cfg.decode
    # early_stopping as mtx: stop once `num_beams` hypotheses have ended; Marian's score is
    # log P / length ** length_penalty where mtx divides by ((5 + length) / 6) ** alpha: the
    # same ranking only at alpha 0. Only with a beam: transformers refuses them for greedy.
    beam = {"early_stopping": True, "length_penalty": d.alpha} if d.beam > 1 else {}
    never = rules.never_produced(model.specials)
    hf.generation_config = GenerationConfig(
        **ids,
        num_beams=d.beam,
        max_length=cfg.model.max_positions,
        bad_words_ids=[[v.origin[i]] for i in never],  # mtx never outputs these
        **beam,
    )
    hf.save_pretrained(out)
    for name, proto in zip(("source.spm", "target.spm"), v.models):
        (out / name).write_bytes(proto)
    pieces = {v.id_to_piece(i): v.origin[i] for i in range(v.get_piece_size())}
    (out / "vocab.json").write_text(json.dumps(pieces, ensure_ascii=False, indent=0) + "\n")
    tokenizer = MarianTokenizer(
        str(out / "source.spm"),
        str(out / "target.spm"),
        str(out / "vocab.json"),
        model_max_length=cfg.model.max_positions,
    )
    tokenizer.save_pretrained(out)
