"""A Hugging Face MarianMT model (OPUS-MT's format) as an mtx checkpoint.

What maps, and how (the export's name map, mtx/export/marian.py, read backwards):

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
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

from mtx.checkpoint import Checkpoint, read_tensors
from mtx.config import Config
from mtx.data.vocab import Paired
from mtx.errors import MtxError
from mtx.export.marian import MARIAN_LAYER_NORM_EPS, from_marian_state_dict
from mtx.model.build import make_model
from mtx.tokens import EOS_ID, PAD_ID, UNK_ID

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
