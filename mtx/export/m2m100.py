"""`mtx export --format hf` of an imported NLLB model: a Hugging Face M2M100 directory again.

The inverse of mtx/pretrained/nllb.py: the layers' weights under M2M100's names (MarianMT's,
export/marian.py's map, in the model dimension's own order), each stack's final LayerNorm,
the vocabulary back in fairseq's order; `sentencepiece.bpe.model` and the tokenizer's files
kept from the import (tokenizer.json, tokenizer_config.json), written back byte for byte, so
that the ids of the language codes are the original's. Importing a model and exporting it
again gives back the same tensors and files.
"""

from __future__ import annotations

from pathlib import Path

from mtx.config import Config
from mtx.data import vocab
from mtx.errors import MtxError
from mtx.export.marian import load_into, marian_state_dict
from mtx.model.transformer import Transformer
from mtx.pretrained.nllb import SPM

ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}  # ours -> transformers'


def m2m100_config(cfg: Config, vocab_size: int):
    from transformers import M2M100Config

    m = cfg.model
    return M2M100Config(
        vocab_size=vocab_size, d_model=m.d_model, encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers, encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads, encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.decoder_d_ff or m.d_ff, activation_function=ACTIVATIONS[m.activation],
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
