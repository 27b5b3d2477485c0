"""A small NLLB model built here in M2M100's exact layout (these machines cannot reach the
hub): one SentencePiece BPE model for both sides with NLLB's ids (<unk> 0, <s> 1, </s> 2, which
NllbTokenizer shifts onto fairseq's <s> 0, <pad> 1, </s> 2, <unk> 3), language codes as added
tokens, pre-norm layers with final stack norms, fairseq's sinusoidal positions counted from 2,
the decoder starting from </s>; weights trained briefly on the toy corpus here (eng_Latn ->
deu_Latn)."""

from __future__ import annotations

import io
from pathlib import Path

import sentencepiece as spm
import torch
from helpers import opus

from mtx.data import toy

CODES = ["eng_Latn", "deu_Latn", "fra_Latn"]


def build(out: Path, seed: int = 0, steps: int = 150, **config) -> Path:
    """Write the model directory `out` (M2M100ForConditionalGeneration + NllbTokenizer
    files), trained for `steps` updates on the toy corpus."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    pairs = toy.split_pairs("train")[:2000]
    out.mkdir(parents=True)
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([s for s, _ in pairs] + [t for _, t in pairs]),
        model_writer=proto, model_type="bpe", vocab_size=200, character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2, num_threads=1, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1,
    )  # fmt: skip
    (out / "sentencepiece.bpe.model").write_bytes(proto.getvalue())
    tokenizer = NllbTokenizer.from_pretrained(
        str(out), src_lang="eng_Latn", tgt_lang="deu_Latn", additional_special_tokens=CODES
    )
    V = len(tokenizer) + 2  # as NLLB-200's: more rows than the tokenizer has tokens
    settings = dict(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function="relu", max_position_embeddings=64,
        pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2,
        scale_embedding=True, dropout=0.1, num_beams=4,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(M2M100Config(**(settings | config)))
    opus.train(model, tokenizer, pairs, steps)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
