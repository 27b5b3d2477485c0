"""The registry of decoder self-sublayers (mtx/model/decoder_self.py): a kind registered there,
in one place, is built, trained, decoded by both searches, counted in FLOPs, described by
`mtx info` and refused by the exports that do not hold it."""

import dataclasses
import typing

import pytest
import torch
from conftest import tiny_model_config
from test_search import random_src
from torch import Tensor, nn

from mtx.config import ModelConfig
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search, greedy_search
from mtx.decode.static import StaticSearch
from mtx.formats import refusal
from mtx.info import architecture
from mtx.model import decoder_self
from mtx.model.flops import forward_flops
from mtx.model.transformer import Transformer
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID


class Decay(nn.Module):
    """A made-up recurrence: c_t = 0.5 c_(t-1) + W x_t, its output tanh(c_t)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()

    def forward(self, x: Tensor, cache=None) -> Tensor:
        inputs = self.proj(x).float()
        cell = None if cache is None else cache.cell()
        cell = torch.zeros_like(inputs[:, 0]) if cell is None else cell
        out = []
        for t in range(x.size(1)):
            cell = 0.5 * cell + inputs[:, t]
            out.append(cell)
        if cache is not None:
            cache.keep_cell(cell, x.size(1))
        return torch.tanh(torch.stack(out, 1)).to(x.dtype)


DECAY = decoder_self.SelfKind(
    label="decay",
    description="decay decoder layers",
    build=lambda cfg: Decay(cfg.d_model),
    recurrent=True,
    state_width=lambda cfg: cfg.d_model,
    flops=lambda cfg, T, R: 2 * cfg.d_model * cfg.d_model * T,
    exports=(),
)


@pytest.fixture
def decay(monkeypatch):
    """The made-up kind, registered for one test."""
    monkeypatch.setitem(decoder_self.DECODER_SELF, "decay", DECAY)
    return dataclasses.replace(tiny_model_config(), decoder_self="decay")


def model_of(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, 24).eval()


def test_a_registered_kind_is_built_and_learns(decay):
    model = model_of(decay).train()
    assert all(isinstance(layer.self_attn, Decay) for layer in model.decoder_layers)
    src, tgt = random_src(batch=4), random_src(batch=4, seed=2)
    tgt_in = torch.cat([torch.full((4, 1), BOS_ID), tgt[:, :-1]], 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        logits = model(src, tgt_in)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert model.decoder_layers[0].self_attn.proj.weight.grad is not None


def test_a_registered_kind_decodes_alike_in_both_searches_and_incrementally(decay):
    model, src = model_of(decay), random_src(batch=5)
    memory, mask = model.encode(src)
    tokens = torch.tensor([[BOS_ID, 5, 6, 7, 8]] * 5)
    whole = model.decode(tokens, memory, mask)
    cache = model.new_cache()
    steps = [model.decode(tokens[:, t : t + 1], memory if t == 0 else None, mask, cache)
             for t in range(tokens.size(1))]  # fmt: skip
    assert torch.allclose(torch.cat(steps, 1), whole, atol=1e-5)
    shrinking = beam_search(model, src, SearchSettings(beam=3, max_len_b=8))
    static = StaticSearch(model, SearchSettings(beam=3, max_len_b=8), full=False)(src)
    assert [h[0].tokens for h in shrinking] == [h[0].tokens for h in static]
    greedy = greedy_search(model, src, SearchSettings(max_len_b=8))
    static_greedy = StaticSearch(model, SearchSettings(beam=1, max_len_b=8), full=False)(src)
    assert [h.tokens for h in greedy] == [h[0].tokens for h in static_greedy]
    assert any(h.tokens and h.tokens[-1] != EOS_ID for h in greedy)


def test_a_registered_kind_is_counted_described_and_refused_by_exports(decay):
    attention = dataclasses.replace(decay, decoder_self="attention")
    d, T = decay.d_model, 7
    difference = forward_flops(attention, 24, 5, T) - forward_flops(decay, 24, 5, T)
    per_layer = decoder_self.DECODER_SELF["attention"].flops(attention, T, 0) - 2 * d * d * T
    assert difference == decay.decoder_layers * per_layer
    assert "decay decoder layers" in architecture(decay)
    for fmt in ("hf", "ctranslate2"):
        assert refusal(decay, fmt) == (
            f"--format {fmt} has no decay decoder layer (model.decoder_self=decay); "
            "mtx translate and mtx serve run this model"
        )
        assert refusal(attention, fmt) is None


def test_every_kind_a_config_may_name_is_registered():
    hints = typing.get_type_hints(ModelConfig)
    assert set(typing.get_args(hints["decoder_self"])) == set(decoder_self.DECODER_SELF)
    with pytest.raises(ValueError, match="no registered kind"):
        decoder_self.decoder_self(dataclasses.replace(tiny_model_config(), decoder_self="x"))
