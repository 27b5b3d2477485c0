"""`model.output_bias`: a trained bias on the pre-softmax logits (MarianMT's
final_logits_bias), in training (the chunked loss: tests/test_loss.py), in decoding packed or
not and through a shortlist, and in both exports."""

import numpy as np
import pytest
import torch
from conftest import tiny_model_config
from helpers.exports import check_exports
from helpers.translating import texts
from transformers import MarianMTModel

from mtx.checkpoint import Checkpoint
from mtx.config import load_config
from mtx.data import toy
from mtx.decode.shortlist import Shortlist, vocabulary_sha256
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.formats import export
from mtx.model.transformer import Transformer


def test_the_bias_is_added_to_the_logits_packed_or_not():
    torch.manual_seed(0)
    plain = Transformer(tiny_model_config(), 40).eval()
    biased = Transformer(tiny_model_config(output_bias=True), 40).eval()
    state = plain.state_dict() | {"logits_bias": torch.randn(40)}
    biased.load_state_dict(state)
    src, tgt = torch.randint(4, 40, (3, 6)), torch.randint(4, 40, (3, 5))
    with torch.no_grad():
        want = plain(src, tgt) + state["logits_bias"]
        torch.testing.assert_close(biased(src, tgt), want, atol=1e-5, rtol=0)
        assert biased.pack("fp32")
        memory, mask = biased.encode(src)
        torch.testing.assert_close(biased.decode(tgt, memory, mask), want, atol=1e-4, rtol=0)
    assert Transformer(tiny_model_config(), 40).output_bias() is None
    with pytest.raises(MtxError, match="model.output_bias .True. is a transformer setting"):
        load_config(None, ["model.arch=rnn", "model.output_bias=true"])


@pytest.fixture(scope="module")
def biased(toy_run, tmp_path_factory):
    """The toy run's best.pt with a non-zero output bias, and its exports."""
    ckpt = Checkpoint.load(toy_run / "checkpoints" / "best.pt")
    ckpt.config.model.output_bias = True
    vocab = ckpt.model["embed.weight"].size(0)
    ckpt.model["logits_bias"] = torch.randn(vocab, generator=torch.Generator().manual_seed(0))
    root = tmp_path_factory.mktemp("bias")
    ckpt.save(root / "model.pt")
    export(root / "model.pt", "hf", root / "hf")
    export(root / "model.pt", "ctranslate2", root / "ct2")
    return root


def test_both_exports_hold_the_bias(biased):
    translator = check_exports(biased / "model.pt", biased / "hf", biased / "ct2")
    hf = MarianMTModel.from_pretrained(biased / "hf")
    bias = translator.parts.model.output_bias()
    assert bias.abs().max() > 1  # a bias that matters
    torch.testing.assert_close(hf.final_logits_bias[0], bias, atol=0, rtol=0)


def test_a_shortlist_keeps_the_bias_of_its_candidates(biased, tmp_path):
    """Greedy and beam search through a shortlist of every piece give the full model's
    outputs: the candidates' bias rows go with their weight rows (without them, the outputs
    differ: the bias is large)."""
    plain = Translator.from_checkpoints(biased / "model.pt", device="cpu")
    vocab = plain.parts.model.vocab_size
    everything = Shortlist(
        np.tile(np.arange(4, vocab, dtype=np.int32), (vocab, 1)),
        np.arange(4, 4, dtype=np.int32),
        vocabulary_sha256(plain.parts.codec.vocab.sp.serialized_model_proto()),
    )
    everything.save(tmp_path / "all.npz")
    lines = [src for src, _ in toy.split_pairs("test")[:20]]
    for beam in (1, 4):
        sets = [f"decode.beam={beam}"]
        full = Translator.from_checkpoints(biased / "model.pt", sets, device="cpu")
        listed = Translator.from_checkpoints(
            biased / "model.pt", [*sets, f"decode.shortlist={tmp_path / 'all.npz'}"], device="cpu"
        )
        assert texts(listed, lines) == texts(full, lines)
