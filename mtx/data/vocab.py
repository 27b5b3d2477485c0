"""The joint SentencePiece BPE model shared by source and target.

Ids 0-3 are fixed (pad, unk, bos, eos): `mtx.tokens`.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import sentencepiece as spm

from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def train_bpe(
    sentences: Iterator[str],
    vocab_size: int,
    sample: int,
    character_coverage: float,
    reserved: list[str] | None = None,
) -> bytes:
    """Train a BPE model on `sentences` (source and target text mixed); returns the model
    proto. `reserved` pieces (target-language tags) get the ids after the fixed four, and
    are never split or merged with text."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,  # small corpora may support fewer pieces than asked
        character_coverage=character_coverage,
        input_sentence_size=sample,
        shuffle_input_sentence=True,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        max_sentence_length=1 << 16,
        user_defined_symbols=reserved or [],
        num_threads=2,
        minloglevel=2,
    )
    return model.getvalue()


def load(model_proto: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=model_proto)
