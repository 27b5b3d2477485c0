"""Linear layers packed for CPU inference (mtx/model/packed.py) and Model.pack."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model_config

from mtx.decode.translator import decode_dtype
from mtx.errors import MtxError
from mtx.model.attention import MultiHeadAttention
from mtx.model.layers import FeedForward
from mtx.model.packed import PackedLinear
from mtx.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
# (out, in) shapes of the layers of a decoder step, the output projection among them
SHAPES = [(768, 256), (256, 256), (1024, 256), (256, 1024), (8000, 256)]


def _inputs(rows: int, width: int) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(rows, width) * torch.rand(rows, 1) * 4  # rows of unlike magnitudes


@pytest.mark.parametrize("kind", ["fp32", "int8"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_packed_layer_gives_each_row_the_same_numbers_in_any_batch(kind, shape):
    """Bit for bit: row i computed in batches of 1 to 40 rows, starting anywhere. Plain BLAS
    products are not like this (model/rows.py), nor is fbgemm's quantization of the whole input,
    which `int8` works around."""
    torch.manual_seed(0)
    weight, bias = torch.randn(shape) * 0.05, torch.randn(shape[0])
    layer = PackedLinear(weight, bias, kind)
    x = _inputs(60, shape[1])
    together = layer(x)
    for rows in (1, 2, 3, 5, 8, 15, 16, 17, 40):
        for first in (0, 7, 20):
            assert torch.equal(layer(x[first : first + rows]), together[first : first + rows])
    plain = F.linear(x, weight, bias)
    error = ((together - plain).norm() / plain.norm()).item()
    assert error < (1e-6 if kind == "fp32" else 0.03), error  # int8: 7-bit inputs, 8-bit weights


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_a_packed_layer_fuses_the_relu_and_keeps_batch_shapes(kind):
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 32), torch.randn(64)
    x = torch.randn(3, 5, 32)
    out = PackedLinear(weight, bias, kind, activation="relu")(x)
    assert out.shape == (3, 5, 64) and out.min() == 0
    plain = F.relu(F.linear(x, weight, bias))
    assert ((out - plain).norm() / plain.norm()).item() < (1e-6 if kind == "fp32" else 0.03)


def test_an_all_zero_row_stays_zero_plus_the_bias_in_int8():
    weight, bias = torch.randn(16, 8), torch.randn(16)
    out = PackedLinear(weight, bias, "int8")(torch.zeros(2, 8))
    torch.testing.assert_close(out, bias.expand(2, 16))


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        PackedLinear(torch.randn(4, 4), None, "int4")


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(), vocab_size=50).eval()


def test_pack_prepares_every_layer_and_is_used_in_eval_mode_only(monkeypatch):
    calls = []
    real = PackedLinear.__call__
    monkeypatch.setattr(PackedLinear, "__call__", lambda self, x: calls.append(1) or real(self, x))
    model = _model()
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 6))
    with torch.no_grad():
        plain = model(src, tgt)
        assert model.pack("fp32")
        packed = model(src, tgt)
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                assert set(module.packed) == (
                    {"q", "kv", "out"} if module.cross else {"qkv", "out"}
                )
            if isinstance(module, FeedForward):
                assert (
                    set(module.packed) == {"fc1", "fc2"}
                    and module.packed["fc1"].activation == "relu"
                )
        assert model.packed_output is not None
        torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-5)
        layers = model.cfg.encoder_layers * 4 + model.cfg.decoder_layers * 7 + 1
        assert len(calls) == layers  # every linear layer ran packed
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        torch.testing.assert_close(model.train()(src, tgt), plain)  # training (fused attention)
        assert len(calls) == layers  # ... with the weights themselves, never the packed copies
        model.eval()
        assert model.pack("int8")
        quantized = model(src, tgt)
        assert not torch.allclose(quantized, plain, atol=1e-4)
        torch.testing.assert_close(quantized, plain, atol=0.15, rtol=0.1)
        assert not model.pack(None) and model.packed_output is None
        assert all(not getattr(m, "packed", None) for m in model.modules())
        assert torch.equal(model(src, tgt), plain)


def test_pack_is_refused_off_the_cpu_or_in_another_dtype():
    model = _model().to(torch.bfloat16)
    assert not model.pack("fp32") and model.packed_output is None


def test_int8_decoding_runs_on_the_cpu_only():
    assert decode_dtype(torch.device("cpu"), "int8") == torch.float32
    with pytest.raises(MtxError, match="int8 runs on the CPU only"):
        decode_dtype(torch.device("cuda"), "int8")
