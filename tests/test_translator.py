import pytest
import sentencepiece as spm
import torch
from conftest import tiny_model_config

from mtx.config import Config
from mtx.data import vocab
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.model.transformer import Transformer

SENTENCES = ["the dog sleeps.", "a cat sees the bird.", "the man gives a book to the child."] * 20


@pytest.fixture(scope="module")
def spm_proto():
    return vocab.train_bpe(iter(SENTENCES), vocab_size=40, sample=0, character_coverage=1.0)


def test_translator_keeps_order_and_one_output_per_input(spm_proto):
    sp = spm.SentencePieceProcessor(model_proto=spm_proto)
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), sp.get_piece_size())
    cfg = Config()
    cfg.decode.batch_tokens = 16  # forces several batches
    translator = Translator(model, cfg, spm_proto, device="cpu")
    lines = ["the dog sleeps.", "", "a cat sees the bird. " * 30, "the dog sleeps.", "  "]
    out = translator.translate(lines)
    assert len(out) == len(lines) and all("\n" not in o for o in out)
    assert out[0] == out[3]
    assert out == [translator.translate([line])[0] for line in lines]
    streamed = list(translator.translate_stream(iter(lines), chunk_lines=2))
    assert streamed == out


def test_a_model_and_vocabulary_that_do_not_match_are_refused(spm_proto):
    model = Transformer(tiny_model_config(), 999)
    with pytest.raises(MtxError, match="do not belong together"):
        Translator(model, Config(), spm_proto, device="cpu")
