"""A small OPUS-MT model built here in MarianMT's exact layout (these machines cannot reach the
hub): separate source and target SentencePiece models, a joint vocab.json with MarianMT's ids
(</s> 0, <unk> 1, <pad> last, the decoder starting from <pad>), swish, a non-zero
final_logits_bias, weights trained briefly on the toy corpus here; optionally multilingual, with >>xxx<< target tokens."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch

from mtx.data import toy

TAGS = [">>deu<<", ">>nld<<"]


def _spm(lines: list[str], size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        model_type="unigram",  # as OPUS-MT's
        vocab_size=size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    return out.getvalue()


def build(out: Path, multilingual: bool = False, seed: int = 0, steps: int = 300, **config) -> Path:
    """Write the model directory `out` (MarianMTModel + MarianTokenizer files), trained for
    `steps` updates on the toy corpus."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    pairs = toy.split_pairs("train")[:2000]
    out.mkdir(parents=True)
    source, target = _spm([s for s, _ in pairs], 120), _spm([t for _, t in pairs], 140)
    (out / "source.spm").write_bytes(source)
    (out / "target.spm").write_bytes(target)
    pieces = []
    for proto in (source, target):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in pieces:
                pieces.append(sp.id_to_piece(i))
    table = ["</s>", "<unk>", *(TAGS if multilingual else []), *pieces, "<pad>"]
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(table)}))
    V = len(table)
    settings = dict(
        vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=64,
        pad_token_id=V - 1, eos_token_id=0, bos_token_id=0, decoder_start_token_id=V - 1,
        forced_eos_token_id=0, scale_embedding=True, share_encoder_decoder_embeddings=True,
        dropout=0.1, num_beams=4,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**(settings | config)))
    tokenizer = MarianTokenizer(
        str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json")
    )
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)  # a buffer: it stays as it is
    tag = TAGS[0] + " " if multilingual else ""
    train(model, tokenizer, [(tag + s, t) for s, t in pairs], steps)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train(model, tokenizer, pairs: list[tuple[str, str]], steps: int) -> None:
    """A few hundred updates on the toy corpus, so that outputs vary with the source and end
    (a random post-norm model says the same thing to every source, forever): MarianMT's or
    M2M100's (helpers/nllb.py), with its tokenizer."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        start = step * 32 % (len(pairs) - 32)
        batch = pairs[start : start + 32]
        enc = tokenizer(
            [s for s, _ in batch], text_target=[t for _, t in batch], return_tensors="pt",
            padding=True,
        )  # fmt: skip
        enc["labels"][enc["labels"] == model.config.pad_token_id] = -100
        loss = model(**enc).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
