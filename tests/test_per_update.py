"""benchmarks/per_update.py: its ablations change what they say, and together they make
`model.init: xavier` into `model.init: fairseq`."""

import pytest
import torch
from conftest import tiny_model_config

from benchmarks.per_update import ABLATIONS, patch
from mtx.model import transformer
from mtx.train import step


@pytest.fixture
def restore(monkeypatch):
    """Whatever `patch` changes is put back after the test."""
    monkeypatch.setattr(
        transformer.Transformer, "reset_parameters", transformer.Transformer.reset_parameters
    )
    monkeypatch.setattr(step, "rate", step.rate)


def bounds(init: str) -> list[float]:
    """The largest magnitudes of one decoder layer's W^Q, W^K, W^V, Q/K/V biases, and
    feed-forward weights and second bias, rounded to 3 decimals (near each scheme's bound)."""
    torch.manual_seed(0)
    cfg = tiny_model_config(d_model=256, d_ff=1024, encoder_layers=1, decoder_layers=1, init=init)
    layer = transformer.Transformer(cfg, 100).decoder_layers[0]
    w, ffn = layer.cross_attn.in_proj.weight, layer.ffn
    tensors = (w[:256], w[256:512], w[512:], layer.cross_attn.in_proj.bias)
    tensors += (ffn.fc1.weight, ffn.fc2.weight, ffn.fc2.bias)
    return [round(t.abs().max().item(), 3) for t in tensors]


def test_all_init_ablations_on_xavier_give_fairseqs_bounds(restore):
    fairseq, xavier = bounds("fairseq"), bounds("xavier")
    patch({"qk_gain", "v_gain", "qkv_bias", "ffn_linear"})
    assert bounds("xavier") == fairseq
    assert all(x != f for x, f in zip(xavier, fairseq))


@pytest.mark.parametrize("name, changed", [("qk_gain", {0, 1}), ("v_gain", {2}),
                                           ("qkv_bias", {3}), ("ffn_linear", {4, 5, 6})])  # fmt: skip
def test_each_init_ablation_changes_only_its_weights(restore, name, changed):
    xavier = bounds("xavier")
    patch({name})
    assert {i for i, (x, p) in enumerate(zip(xavier, bounds("xavier"))) if x != p} == changed
    assert step.rate(1, 256, 500) > 0  # the schedule untouched


def test_lr0_delays_the_schedule_by_one_update(restore):
    plain = [step.rate(n, 256, 500, 0.3578) for n in (1, 2, 600)]
    patch({"lr0"})
    shifted = [step.rate(n, 256, 500, 0.3578) for n in (1, 2, 600)]
    assert shifted[0] == 0.0 and shifted[1] == plain[0]
    assert shifted[2] == pytest.approx(plain[2] * (600 / 599) ** 0.5)
    assert set(ABLATIONS) == {"qk_gain", "v_gain", "qkv_bias", "ffn_linear", "lr0"}
