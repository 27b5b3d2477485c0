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
decoder starts from our BOS (decoder_start_token_id).
What Marian cannot express (another LayerNorm epsilon than its fixed 1e-5) is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from mtx.config import Config
from mtx.data import vocab
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

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


def marian_config(cfg: Config, vocab_size: int):
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
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID,
    )


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our weights under MarianMTModel's names, the model dimension permuted (see module doc)."""
    d = model.cfg.d_model
    p = marian_permutation(d)
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out: dict[str, Tensor] = {}

    def norm(dst: str, src: str) -> None:
        out[f"{dst}.weight"] = ours[f"{src}.weight"][p]
        out[f"{dst}.bias"] = ours[f"{src}.bias"][p]

    def attention(dst: str, src: str) -> None:
        w, b = ours[f"{src}.in_proj.weight"][:, p], ours[f"{src}.in_proj.bias"]
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[f"{dst}.{name}.weight"] = w[i * d : (i + 1) * d]
            out[f"{dst}.{name}.bias"] = b[i * d : (i + 1) * d]
        out[f"{dst}.out_proj.weight"] = ours[f"{src}.out_proj.weight"][p]
        out[f"{dst}.out_proj.bias"] = ours[f"{src}.out_proj.bias"][p]

    def ffn(dst: str, src: str) -> None:
        out[f"{dst}.fc1.weight"] = ours[f"{src}.ffn.fc1.weight"][:, p]
        out[f"{dst}.fc1.bias"] = ours[f"{src}.ffn.fc1.bias"]
        out[f"{dst}.fc2.weight"] = ours[f"{src}.ffn.fc2.weight"][p]
        out[f"{dst}.fc2.bias"] = ours[f"{src}.ffn.fc2.bias"][p]

    embed = ours["embed.weight"][:, p]
    for name in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens"):
        out[f"{name}.weight"] = embed
    out["lm_head.weight"] = embed
    bias = model.output_bias()  # model.output_bias, else Marian's zeros
    out["final_logits_bias"] = (
        torch.zeros(1, model.vocab_size) if bias is None else bias.detach().float().cpu()[None]
    )
    for i in range(model.cfg.encoder_layers):
        dst, src = f"model.encoder.layers.{i}", f"encoder_layers.{i}"
        attention(f"{dst}.self_attn", f"{src}.self_attn")
        norm(f"{dst}.self_attn_layer_norm", f"{src}.self_attn_norm")
        ffn(dst, src)
        norm(f"{dst}.final_layer_norm", f"{src}.ffn_norm")
    for i in range(model.cfg.decoder_layers):
        dst, src = f"model.decoder.layers.{i}", f"decoder_layers.{i}"
        attention(f"{dst}.self_attn", f"{src}.self_attn")
        norm(f"{dst}.self_attn_layer_norm", f"{src}.self_attn_norm")
        attention(f"{dst}.encoder_attn", f"{src}.cross_attn")
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}.cross_attn_norm")
        ffn(dst, src)
        norm(f"{dst}.final_layer_norm", f"{src}.ffn_norm")
    return out


def to_marian(model: Transformer, cfg: Config):
    """A `transformers.MarianMTModel` (eval mode) computing the same logits as `model`."""
    from transformers import MarianMTModel

    check_exportable(cfg)
    hf = MarianMTModel(marian_config(cfg, model.vocab_size)).eval()
    weights = marian_state_dict(model)
    expected = hf.state_dict()
    positions = {k for k in expected if k.endswith("embed_positions.weight")}
    missing = set(expected) - set(weights) - positions
    unexpected = set(weights) - set(expected)
    if missing or unexpected:  # a transformers version with other names: fail loudly
        raise MtxError(
            f"this transformers version names MarianMT's weights differently "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    with torch.no_grad():
        for name, tensor in weights.items():
            expected[name].copy_(tensor)
    return hf


def export_hf(model: Transformer, cfg: Config, spm_proto: bytes, out: Path) -> None:
    """Write a directory that `MarianMTModel.from_pretrained` and
    `MarianTokenizer.from_pretrained` load offline."""
    from transformers import GenerationConfig, MarianTokenizer

    hf = to_marian(model, cfg)
    d = cfg.decode
    # early_stopping as mtx: stop once `num_beams` hypotheses have ended; Marian's score is
    # log P / length ** length_penalty where mtx divides by ((5 + length) / 6) ** alpha: the
    # same ranking only at alpha 0. Only with a beam: transformers refuses them for greedy.
    beam = {"early_stopping": True, "length_penalty": d.alpha} if d.beam > 1 else {}
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        num_beams=d.beam,
        max_length=cfg.model.max_positions,
        bad_words_ids=[[PAD_ID], [UNK_ID], [BOS_ID]],  # mtx never outputs these
        **beam,
    )
    hf.save_pretrained(out)
    sp = vocab.load(spm_proto)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(spm_proto)
    pieces = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    (out / "vocab.json").write_text(json.dumps(pieces, ensure_ascii=False, indent=0) + "\n")
    tokenizer = MarianTokenizer(
        str(out / "source.spm"),
        str(out / "target.spm"),
        str(out / "vocab.json"),
        model_max_length=cfg.model.max_positions,
    )
    tokenizer.save_pretrained(out)
