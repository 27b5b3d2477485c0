"""mtx/data/words.py: a corpus's ids, each distinct word encoded once, equal to
SentencePiece's encoding of each sentence whole."""

import io
import unicodedata

import numpy as np
import pyarrow as pa
import pytest
import sentencepiece as spm
from conftest import MULTI30K
from hypothesis import given as for_all
from hypothesis import settings
from hypothesis import strategies as st

from mtx.data import vocab
from mtx.data.prepare import Encoder
from mtx.data.words import Words, splits_at_words
from mtx.tokens import EOS_ID

TAGS = ["<2de>", "<2en>"]


def _lines() -> list[str]:
    return [
        line
        for lang in ("de", "en")
        for line in (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    ]


@pytest.fixture(scope="module")
def sp() -> spm.SentencePieceProcessor:
    """A BPE model as `mtx prepare` trains it, on Multi30k's training captions."""
    return vocab.load_spm(vocab.train_bpe(iter(_lines()[::4]), 2000, 0, 0.9995, TAGS))


def _in_batches(words: Words, texts: list[str], size: int) -> list[list[int]]:
    out = []
    for i in range(0, len(texts), size):
        ids, offsets = words.encode(pa.array(texts[i : i + size], pa.string()))
        assert ids.dtype == np.int32 and offsets[-1] == len(ids)
        out += [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    return out


def test_multi30k_encodes_as_sentencepiece_encodes_each_sentence(sp):
    lines = _lines()
    rng = np.random.default_rng(0)  # sentences of 1 to 3 captions, as WMT-length lines
    texts = [
        " ".join(lines[j] for j in rng.integers(0, len(lines), rng.integers(1, 4)))
        for _ in range(6000)
    ]
    texts += lines[:4000]  # no-break spaces among them: sentences encoded whole
    assert splits_at_words(sp)
    words = Words(sp)
    assert _in_batches(words, texts, 1000) == sp.encode(texts)
    assert words.whole.any() and not words.whole.all()
    assert len(words.row) < sum(len(t.split(" ")) for t in texts) / 5  # each word once


ODD = [
    " ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u2002", "\u200b", "\u0301", "\u0308", "e",
    "\ufb01", "\uff21", "\u2581", "\x01", "\ufffd", "<2de>", "A", "b", "7", ".", "ß", "ü", "😀",
    "\u00b4", "\u02dc", "\u1100", "\u1161",
]  # fmt: skip


def test_every_character_normalisation_touches_encodes_as_sentencepiece_encodes_it(sp):
    """Each code point that NFKC changes, and each space, mark and control character, at a
    word's start, at its end, alone and doubled: what normalisation does at a word's edges
    (spaces it makes or removes, marks composing across them) never changes the ids."""
    chars = [
        chr(cp)
        for cp in range(0x20, 0x30000)
        if not 0xD800 <= cp < 0xE000
        and (
            unicodedata.normalize("NFKC", chr(cp)) != chr(cp)
            or unicodedata.category(chr(cp)) in ("Mn", "Mc", "Me", "Zs", "Zl", "Zp", "Cc", "Cf")
        )
    ]
    assert len(chars) > 5000
    texts = [t for c in chars for t in (f"a {c}x", f"a{c} b", f"{c}", f"x {c}{c} {c}")]
    words = Words(sp)
    assert _in_batches(words, texts, 10_000) == sp.encode(texts)
    assert words.whole.any()  # some are spaces once normalised


SHARED: dict = {}  # one word table for every example


@settings(max_examples=200, deadline=None)
@for_all(st.lists(st.lists(st.sampled_from(ODD), max_size=12).map("".join), max_size=20))
def test_any_text_encodes_as_sentencepiece_encodes_it_whole(sp, texts):
    """Spaces of every kind, marks that compose with what comes before, ligatures, control
    characters, the word boundary itself, tags, unknown characters: the same ids, one table
    for every example (words met before are looked up)."""
    assert _in_batches(SHARED.setdefault("words", Words(sp)), texts, 7) == sp.encode(texts)


def test_a_model_whose_pieces_span_words_is_handed_whole_sentences():
    model = io.BytesIO()
    lines = _lines()[::8]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=1500,
        split_by_whitespace=False, minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
    )  # fmt: skip
    sp = vocab.load_spm(model.getvalue())
    assert not splits_at_words(sp)  # pieces such as "a▁man"
    words = Words(sp)
    assert _in_batches(words, lines[:2000], 500) == sp.encode(lines[:2000])
    assert not words.row  # no word table


def test_the_encoder_puts_the_tag_before_and_eos_after_each_source(tmp_path, sp):
    path = tmp_path / "spm.model"
    path.write_bytes(sp.serialized_model_proto())
    tag = sp.piece_to_id("<2de>")
    src, tgt = ["ein Mann", "", "zwei  Hunde\u00a0laufen"], ["a man", "x", ""]
    out = Encoder(path, group=3, tag=tag)(pa.table({"src": src, "tgt": tgt, "line": [4, 5, 6]}))
    assert out["src_ids"].to_pylist() == [[tag] + ids + [EOS_ID] for ids in sp.encode(src)]
    assert out["tgt_ids"].to_pylist() == [ids + [EOS_ID] for ids in sp.encode(tgt)]
    assert out["src_len"].to_pylist() == [len(x) for x in out["src_ids"].to_pylist()]
    assert out["group"].to_pylist() == [3] * 3 and out["line"].to_pylist() == [4, 5, 6]
    empty = Encoder(path)(
        pa.table({"src": pa.array([], pa.string()), "tgt": pa.array([], pa.string())})
    )
    assert len(empty) == 0 and empty["src_ids"].type == pa.list_(pa.int32())


def test_a_unigram_model_given_by_data_spm_model_encodes_the_same():
    model = io.BytesIO()
    lines = _lines()[::8]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="unigram", vocab_size=1500,
        minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
    )  # fmt: skip
    sp = vocab.load_spm(model.getvalue())
    assert splits_at_words(sp)
    texts = [" ".join(lines[i : i + 3]) for i in range(0, 6000, 3)]
    assert _in_batches(Words(sp), texts, 500) == sp.encode(texts)
