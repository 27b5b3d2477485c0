"""M2M100 (NLLB-200), both directions: `mtx import` of a Hugging Face M2M100 model and `mtx
export --format hf` of an imported one.

## Import

A Hugging Face M2M100 model (NLLB-200's format) as an mtx checkpoint.

What maps, and how:

- The network is ours with three settings: pre-norm layers with a final LayerNorm on each
  stack (model.norm: pre), fairseq's sinusoidal positions counted from 2 (model.positions:
  fairseq, model/positions.py), and the decoder starting from EOS (model.decoder_start: eos).
  Embeddings are scaled by sqrt(d) and tied to the output projection, as ours; q/k/v join
  into our in_proj, the layers' weights named as MarianMT names them (weights.py's
  map, read in the model dimension's own order).
- The vocabulary: `sentencepiece.bpe.model` segments both sides, with fairseq's ids: <s> 0,
  <pad> 1, </s> 2, <unk> 3, then SentencePiece's piece k (k >= 3) at k + 1; then the
  tokenizer's added tokens (the language codes, <mask>) at the ids its tokenizer.json or
  tokenizer_config.json gives them; rows of the weights past those are unused pieces. fairseq's
  ids are permuted onto ours: <pad> 0, <unk> 1, <s> 2 (BOS, unused), </s> 3, the rest in order.
- Languages: a source reads `[source code] pieces </s>`; the decoder reads `</s> [target code]`
  before its output (Request.start), as NLLB's tokenizer and `forced_bos_token_id` do: the
  code is given, not scored. `--src-lang` and `--tgt-lang` name them (eng_Latn, deu_Latn).

Whatever mtx cannot express is refused in one line naming it, before anything is written.

## Export

`mtx export --format hf` of an imported NLLB model: a Hugging Face M2M100 directory again.

The inverse of the import above: the layers' weights under M2M100's names (MarianMT's,
weights.py's map, in the model dimension's own order), each stack's final LayerNorm,
the vocabulary back in fairseq's order; `sentencepiece.bpe.model` and the tokenizer's files
kept from the import (tokenizer.json, tokenizer_config.json), written back byte for byte, so
that the ids of the language codes are the original's. Importing a model and exporting it
again gives back the same tensors and files.
"""

from __future__ import annotations

import json
from pathlib import Path

import sentencepiece as spm

from mtx.checkpoint import Checkpoint
from mtx.config import Config
from mtx.data import vocab
from mtx.data.vocab import Paired
from mtx.errors import MtxError
from mtx.formats.marian import ACTIVATIONS, checked_state, described, model_config, read_weights
from mtx.formats.weights import load_into, marian_state_dict
from mtx.model.transformer import Transformer

EXPORT_ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}  # ours -> transformers'


SPM = "sentencepiece.bpe.model"


# kept in the checkpoint as they are, for the export back to M2M100
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


FAIRSEQ = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}  # fairseq's fixed ids


UNUSED = "<unused_"  # the piece of a row of the weights the tokenizer has no token for


def refusal(c: dict) -> str | None:
    """Why this M2M100 config cannot be an mtx model (None: it can)."""
    checks = [
        (c.get("activation_function", "relu") not in ACTIVATIONS,
         f"activation_function {c.get('activation_function')!r}"),
        (not c.get("scale_embedding", False), "embeddings not scaled by sqrt(d_model)"),
        (c.get("encoder_attention_heads") != c.get("decoder_attention_heads"),
         "another number of attention heads in the decoder than in the encoder"),
        (c.get("d_model", 0) % 2, f"an odd d_model ({c.get('d_model')})"),
        (c.get("decoder_start_token_id", 2) != c.get("eos_token_id", 2),
         "a decoder that does not start from its EOS token"),
        ((c.get("pad_token_id", 1), c.get("eos_token_id", 2), c.get("bos_token_id", 0))
         != (1, 2, 0), "special ids other than fairseq's (<s> 0, <pad> 1, </s> 2)"),
        (c.get("tie_word_embeddings", True) is False,
         "an output projection not tied to the embeddings (tie_word_embeddings false)"),
    ]  # fmt: skip
    for failed, what in checks:
        if failed:
            return what
    return None


def added_tokens(directory: Path) -> dict[int, str]:
    """{id: piece} of the tokenizer's added tokens (language codes, <mask>), from
    tokenizer.json's added_tokens or tokenizer_config.json's added_tokens_decoder."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise MtxError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
        if "added_tokens" in data:
            return {int(t["id"]): t["content"] for t in data["added_tokens"]}
        if "added_tokens_decoder" in data:
            return {int(i): t["content"] for i, t in data["added_tokens_decoder"].items()}
    raise MtxError(
        f"{directory}: no tokenizer.json or tokenizer_config.json with the added tokens "
        "(NLLB's language codes)"
    )


def fairseq_pieces(directory: Path, size: int) -> tuple[list[str], bytes, dict[int, str]]:
    """The piece of each fairseq id (0 .. size - 1), the SentencePiece model, and the added
    tokens ({id: piece}: the language codes, <mask>)."""
    path = directory / SPM
    if not path.is_file():
        raise MtxError(f"{directory}: no {SPM} (NLLB's tokenizer model)")
    proto = path.read_bytes()
    try:
        sp = spm.SentencePieceProcessor(model_proto=proto)
    except Exception:
        raise MtxError(f"{path}: not a SentencePiece model") from None
    pieces = list(FAIRSEQ) + [sp.id_to_piece(k) for k in range(3, sp.get_piece_size())]
    added = added_tokens(directory)
    for i, piece in sorted(added.items()):
        if i < len(pieces):
            if pieces[i] != piece:
                raise MtxError(f"{directory}: added token {piece!r} at id {i}, which is "
                               f"{pieces[i]!r}'s")  # fmt: skip
            continue
        if i >= size:
            raise MtxError(f"{directory}: the tokenizer's id {i} ({piece}) is past the "
                           f"weights' vocabulary of {size}: they do not belong together")  # fmt: skip
        pieces.extend(f"{UNUSED}{j}>" for j in range(len(pieces), i))
        pieces.append(piece)
    if len(pieces) > size:
        raise MtxError(f"{directory}: the tokenizer has {len(pieces)} pieces, the weights' "
                       f"vocabulary {size}: they do not belong together")  # fmt: skip
    pieces.extend(f"{UNUSED}{j}>" for j in range(len(pieces), size))
    if not any(_is_code(p) for p in added.values()):
        raise MtxError(f"{directory}: the tokenizer names no language codes (such as eng_Latn)")
    return pieces, proto, added


def _is_code(piece: str) -> bool:
    """NLLB's language codes: xxx_Yyyy (eng_Latn, zho_Hans); M2M100's __xx__."""
    lang, _, script = piece.partition("_")
    plain = lang.isalpha() and lang.islower() and script.isalpha() and script.istitle()
    return plain or (piece.startswith("__") and piece.endswith("__") and len(piece) > 4)


def id_order(size: int) -> list[int]:
    """fairseq's id of each of ours: <pad> 0, <unk> 1, <s> 2, </s> 3, then the rest."""
    return [FAIRSEQ["<pad>"], FAIRSEQ["<unk>"], FAIRSEQ["<s>"], FAIRSEQ["</s>"], *range(4, size)]


def convert(
    directory: Path, c: dict, src_lang: str | None, tgt_lang: str | None
) -> tuple[Checkpoint, str]:
    """The checkpoint of the M2M100 model in `directory` (config `c`), and a line saying what
    it is."""
    weights, size = read_weights(directory, c, refusal(c), "M2M100")
    table, proto, added = fairseq_pieces(directory, size)
    codes = sorted(p for p in added.values() if _is_code(p))
    for side, lang in (("--src-lang", src_lang), ("--tgt-lang", tgt_lang)):
        if lang not in codes:
            raise MtxError(f"{directory}: {side} must name one of its language codes (e.g. "
                           f"{', '.join(codes[:3])}), got {lang!r}")  # fmt: skip
    origin = id_order(size)
    pieces = [table[i] for i in origin]
    ours = {p: i for i, p in enumerate(pieces)}
    languages = {p: ours[p] for p in codes}
    cfg = model_config(c, "relu", 1024, norm="pre", positions="fairseq", decoder_start="eos")
    cfg.data.src_lang, cfg.data.tgt_lang = src_lang, tgt_lang
    state = checked_state(directory, cfg, weights, origin, permute=False)
    # what decoding leaves out: fairseq's four, the added tokens, the unused rows
    left_out = set(added.values())
    specials = [i for i, p in enumerate(pieces) if i < 4 or p in left_out or p.startswith(UNUSED)]
    kept = {n: (directory / n).read_bytes() for n in TOKENIZER_FILES if (directory / n).is_file()}
    vocabulary = Paired(pieces, proto, proto, specials, origin, None, "nllb", languages, kept)
    ckpt = Checkpoint(config=cfg, spm_model=vocabulary.blob, vocab_size=size, model=state)
    about = described("NLLB (M2M100)", cfg, size)
    return ckpt, f"{about}, {len(codes)} languages ({src_lang} -> {tgt_lang})"


def m2m100_config(cfg: Config, vocab_size: int):
    from transformers import M2M100Config

    m = cfg.model
    return M2M100Config(
        vocab_size=vocab_size, d_model=m.d_model, encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers, encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads, encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.decoder_d_ff or m.d_ff, activation_function=EXPORT_ACTIVATIONS[m.activation],
        max_position_embeddings=m.max_positions, pad_token_id=1, eos_token_id=2,
        bos_token_id=0, decoder_start_token_id=2, scale_embedding=True,
        dropout=m.dropout, attention_dropout=m.attention_dropout, num_beams=cfg.decode.beam,
        tie_word_embeddings=True,
    )  # fmt: skip


def export_m2m100(model: Transformer, cfg: Config, spm_proto: bytes, out: Path) -> None:
    """Write a directory that `M2M100ForConditionalGeneration.from_pretrained` and
    `NllbTokenizer.from_pretrained` load offline."""
    from transformers import M2M100ForConditionalGeneration

    v = vocab.load(spm_proto)
    if v.family != "nllb":
        raise MtxError("--format hf writes an M2M100 model only of an imported NLLB model")
    hf = M2M100ForConditionalGeneration(m2m100_config(cfg, model.vocab_size)).eval()
    load_into(hf, marian_state_dict(model, v.origin, permute=False), "M2M100")
    hf.save_pretrained(out)
    (out / SPM).write_bytes(v.models[0])
    for name, data in v.files.items():
        (out / name).write_bytes(data)
