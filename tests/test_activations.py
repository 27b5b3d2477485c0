"""`model.activation` (model/rows.py's ACTIVATIONS): the feed-forward layers' ReLU, swish or
GELU, as the formulas say, the same packed and unpacked, and the same in both exports (a
MarianMT model's logits, CTranslate2's log-probabilities) as in mtx."""

import math

import pytest
import torch
from conftest import tiny_model_config
from helpers.exports import check_exports
from transformers import MarianMTModel

from mtx.checkpoint import Checkpoint
from mtx.config import load_config
from mtx.errors import MtxError
from mtx.formats import export
from mtx.model.layers import FeedForward
from mtx.model.rows import ACTIVATIONS
from mtx.model.transformer import Transformer

FORMULAS = {
    "relu": lambda x: torch.clamp(x, min=0),
    "swish": lambda x: x / (1 + torch.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
}


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_each_activation_is_its_formula_packed_or_not(name):
    x = torch.linspace(-8, 8, 801)
    torch.testing.assert_close(ACTIVATIONS[name](x), FORMULAS[name](x), atol=1e-6, rtol=1e-6)
    torch.manual_seed(0)
    ffn = FeedForward(16, 48, activation=name).eval()
    h = torch.randn(3, 5, 16)
    expected = ffn.fc2(FORMULAS[name](ffn.fc1(h)))
    with torch.no_grad():
        torch.testing.assert_close(ffn(h), expected, atol=1e-5, rtol=0)
        ffn.pack("fp32")
        torch.testing.assert_close(ffn(h), expected, atol=1e-5, rtol=0)
        ffn.pack("int8")
        torch.testing.assert_close(ffn(h), expected, atol=0.05, rtol=0.05)


def test_the_activations_differ_and_the_rnn_refuses_one():
    torch.manual_seed(0)
    src = torch.randint(4, 40, (2, 7))
    tgt = torch.randint(4, 40, (2, 5))
    logits = {}
    for name in FORMULAS:
        torch.manual_seed(1)
        model = Transformer(tiny_model_config(activation=name), 40).eval()
        with torch.no_grad():
            logits[name] = model(src, tgt)
    assert not torch.allclose(logits["relu"], logits["swish"])
    assert not torch.allclose(logits["swish"], logits["gelu"])
    with pytest.raises(MtxError, match="model.activation .swish. is a transformer setting"):
        load_config(None, ["model.arch=rnn", "model.activation=swish"])


@pytest.fixture(scope="module", params=["swish", "gelu"])
def relabelled(request, toy_run, tmp_path_factory):
    """The toy run's best.pt with another activation (the same weights), and its exports."""
    ckpt = Checkpoint.load(toy_run / "checkpoints" / "best.pt")
    ckpt.config.model.activation = request.param
    root = tmp_path_factory.mktemp(request.param)
    ckpt.save(root / "model.pt")
    export(root / "model.pt", "hf", root / "hf")
    export(root / "model.pt", "ctranslate2", root / "ct2")
    return request.param, root


def test_both_exports_compute_what_mtx_computes_with_each_activation(relabelled):
    name, root = relabelled
    translator = check_exports(root / "model.pt", root / "hf", root / "ct2")
    assert translator.parts.model.cfg.activation == name
    assert MarianMTModel.from_pretrained(root / "hf").config.activation_function == name
