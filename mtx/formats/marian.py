"""MarianMT (OPUS-MT), both directions: `mtx import` of a Hugging Face MarianMT model and `mtx
export --format hf` of a checkpoint.

## Import

A Hugging Face MarianMT model (OPUS-MT's format) as an mtx checkpoint.

What maps, and how (weights.py's name map, read backwards):

- The network is ours: post-norm, shared sqrt(d)-scaled embeddings tied to the output, static
  sinusoidal positions (sines first: the import permutes the model dimension back into our
  interleaved order), q/k/v joined into our in_proj; swish, GELU or ReLU (model.activation);
  `final_logits_bias` (model.output_bias, kept where it is not all zeros).
- The vocabulary: `source.spm` and `target.spm` segment each side, `vocab.json` gives the
  pieces their ids (data/vocab.py's `Paired`). MarianMT's ids (</s> 0, <unk> 1, <pad> last)
  are permuted onto ours: <pad> 0, <unk> 1, </s> 3, and the lowest other id takes 2 (a piece
  like any other: MarianMT has no BOS), the rest in their order. The decoder starts from
  <pad>, as MarianMT's does (model.decoder_start: pad).
- A multilingual model's target tokens `>>xxx<<` are mtx's own tag convention: `--tgt-lang
  xxx` puts the tag first in the source.

Whatever mtx cannot express is refused in one line naming it, before anything is written.

## Export

`mtx export --format hf`: a checkpoint as a Hugging Face `MarianMTModel` + `MarianTokenizer`.

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
model's PAD). An imported model (the import above, which uses weights.py's name map
backwards) goes back out with its own ids, SentencePiece models and vocab.json.
What Marian cannot express (another LayerNorm epsilon than its fixed 1e-5) is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

from mtx.checkpoint import Checkpoint, read_tensors
from mtx.config import Config
from mtx.data import vocab
from mtx.data.vocab import Paired
from mtx.decode import rules
from mtx.errors import MtxError
from mtx.formats.weights import (
    MARIAN_LAYER_NORM_EPS,
    from_marian_state_dict,
    load_into,
    marian_state_dict,
)
from mtx.model.build import make_model
from mtx.model.transformer import Transformer
from mtx.tokens import EOS_ID, PAD_ID, UNK_ID, Specials

ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}


TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")


def load_weights(directory: Path) -> dict[str, Tensor]:
    """The model's tensors from model.safetensors, or pytorch_model.bin through torch's safe
    loader (never an unsafe unpickling)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return read_tensors(directory / name)
    raise MtxError(f"{directory}: no weights (model.safetensors or pytorch_model.bin)")


def refusal(c: dict) -> str | None:
    """Why this MarianMT config cannot be an mtx model (None: it can)."""
    checks = [
        (c.get("activation_function", "gelu") not in ACTIVATIONS,
         f"activation_function {c.get('activation_function')!r}"),
        (c.get("separate_vocabs", False) or not c.get("share_encoder_decoder_embeddings", True),
         "separate source and target vocabularies (share_encoder_decoder_embeddings false)"),
        (c.get("decoder_vocab_size") not in (None, c.get("vocab_size")),
         "a decoder vocabulary of another size than the encoder's"),
        (not c.get("scale_embedding", False), "embeddings not scaled by sqrt(d_model)"),
        (c.get("normalize_before", False), "pre-norm layers (normalize_before)"),
        (c.get("static_position_embeddings", True) is False, "learned positions"),
        (c.get("encoder_attention_heads") != c.get("decoder_attention_heads"),
         "another number of attention heads in the decoder than in the encoder"),
        (c.get("d_model", 0) % 2, f"an odd d_model ({c.get('d_model')})"),
        (c.get("decoder_start_token_id") != c.get("pad_token_id"),
         "a decoder that does not start from its padding token"),
        (c.get("tie_word_embeddings", True) is False, "an output projection not tied to the "
         "embeddings (tie_word_embeddings false)"),
    ]  # fmt: skip
    for failed, what in checks:
        if failed:
            return what
    return None


def read_vocabulary(directory: Path, size: int) -> tuple[dict[str, int], bytes, bytes]:
    """vocab.json (piece -> MarianMT id) and the two SentencePiece models, checked."""
    for name in TOKENIZER_FILES:
        if not (directory / name).is_file():
            raise MtxError(f"{directory}: no {name} (MarianMT's tokenizer files: "
                           f"{', '.join(TOKENIZER_FILES)})")  # fmt: skip
    try:
        table = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MtxError(f"{directory / 'vocab.json'}: not JSON ({e.msg}, line {e.lineno})") from None
    ids = sorted(table.values())
    if ids != list(range(size)):
        raise MtxError(
            f"{directory / 'vocab.json'}: holds {len(table)} pieces with ids "
            f"{ids[0] if ids else '-'}..{ids[-1] if ids else '-'}, but the weights' vocabulary "
            f"has {size}: they do not belong together"
        )
    if "<unk>" not in table:
        raise MtxError(f"{directory / 'vocab.json'}: no <unk> piece")
    return table, (directory / "source.spm").read_bytes(), (directory / "target.spm").read_bytes()


def id_order(size: int, pad: int, unk: int, eos: int) -> list[int]:
    """MarianMT's id of each of ours: <pad> 0, <unk> 1, the lowest other id 2, </s> 3, then
    the other ids in their order."""
    rest = [i for i in range(size) if i not in (pad, unk, eos)]
    return [pad, unk, rest[0], eos, *rest[1:]]


def model_config(c: dict, activation: str, max_positions: int, **settings) -> Config:
    """The mtx config of a Hugging Face config `c` of MarianMT's or M2M100's (they name their
    settings alike): `activation` and `max_positions` the family's defaults where `c` has
    none; `settings`, the model.* keys the family sets."""
    cfg = Config()
    m = cfg.model
    m.d_model, m.n_heads = c["d_model"], c["encoder_attention_heads"]
    m.encoder_layers, m.decoder_layers = c["encoder_layers"], c["decoder_layers"]
    m.d_ff = c["encoder_ffn_dim"]
    m.decoder_d_ff = 0 if c["decoder_ffn_dim"] == m.d_ff else c["decoder_ffn_dim"]
    m.activation = ACTIVATIONS[c.get("activation_function", activation)]
    for key, value in settings.items():
        setattr(m, key, value)
    m.max_positions = c.get("max_position_embeddings", max_positions)
    m.layer_norm_eps = MARIAN_LAYER_NORM_EPS  # nn.LayerNorm's default: both families'
    m.dropout = c.get("dropout", 0.1)
    m.attention_dropout = c.get("attention_dropout", 0.0)
    cfg.decode.beam = c.get("num_beams") or cfg.decode.beam
    # the longest training pair still fits the positions once padded (config.py checks it)
    cfg.data.max_len = min(cfg.data.max_len, m.max_positions - cfg.train.pad_to)
    return cfg


def read_weights(directory: Path, c: dict, why: str | None, family: str) -> tuple[dict, int]:
    """The weights of the model in `directory` (config `c`) and its vocabulary's size; refused
    in one line if its config cannot be imported (`why`) or they are not `family`'s."""
    if why:
        raise MtxError(f"{directory}: {why} cannot be imported into an mtx model")
    weights = load_weights(directory)
    if "model.shared.weight" not in weights:
        raise MtxError(f"{directory}: the weights hold no model.shared.weight: not {family}'s")
    size = weights["model.shared.weight"].size(0)
    if size != c.get("vocab_size", size):
        raise MtxError(f"{directory}: config.json's vocab_size {c['vocab_size']} is not the "
                       f"weights' {size}")  # fmt: skip
    return weights, size


def checked_state(
    directory: Path, cfg: Config, weights: dict, origin: list[int], permute: bool = True
) -> dict[str, Tensor]:
    """The weights under our names (`from_marian_state_dict`), checked to load into the model
    `cfg` describes; refused in one line if they do not fit its config."""
    try:
        cfg.validate()
        state = from_marian_state_dict(weights, cfg.model, origin, permute)
        make_model(cfg.model, len(origin)).load_state_dict(state)
    except (KeyError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise MtxError(f"{directory}: its weights do not fit its config.json ({first})") from None
    return state


def convert(
    directory: Path, c: dict, src_lang: str | None, tgt_lang: str | None
) -> tuple[Checkpoint, str]:
    """The checkpoint of the MarianMT model in `directory` (config `c`), and a line saying
    what it is."""
    weights, size = read_weights(directory, c, refusal(c), "MarianMT")
    table, source, target = read_vocabulary(directory, size)
    origin = id_order(size, c["pad_token_id"], table["<unk>"], c["eos_token_id"])
    by_id = {i: p for p, i in table.items()}
    pieces = [by_id[i] for i in origin]
    bias = weights.get("final_logits_bias")
    output_bias = bias is not None and bool(bias.abs().max() > 0)
    cfg = model_config(c, "gelu", 512, output_bias=output_bias, decoder_start="pad")
    cfg.data.src_lang = src_lang or cfg.data.src_lang
    cfg.data.tgt_lang = tgt_lang or cfg.data.tgt_lang
    state = checked_state(directory, cfg, weights, origin)
    vocabulary = Paired(pieces, source, target, [PAD_ID, EOS_ID, UNK_ID], origin)
    ckpt = Checkpoint(config=cfg, spm_model=vocabulary.blob, vocab_size=size, model=state)
    return ckpt, described("MarianMT", cfg, size)


def described(family: str, cfg: Config, size: int) -> str:
    """What `mtx import` says of an imported model: its family, shape and vocabulary."""
    m = cfg.model
    return (
        f"{family}: {m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, "
        f"{m.activation}, vocabulary {size}"
    )


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


def to_marian(model: Transformer, cfg: Config, origin: list[int] | None = None):
    """A `transformers.MarianMTModel` (eval mode) computing the same logits as `model`, its
    ids MarianMT's `origin` of ours (None: ours)."""
    from transformers import MarianMTModel

    check_exportable(cfg)
    origin = list(range(model.vocab_size)) if origin is None else origin
    ids = marian_ids(model.specials, origin)
    hf = MarianMTModel(marian_config(cfg, model.vocab_size, ids)).eval()
    return load_into(hf, marian_state_dict(model, origin), "MarianMT")


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
