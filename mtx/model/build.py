"""The model a config names: `model.arch` transformer (transformer.py) or rnn (rnn.py)."""

from __future__ import annotations

from mtx.config import ModelConfig
from mtx.model.rnn import RNN
from mtx.model.transformer import Transformer

Model = Transformer | RNN


def make_model(cfg: ModelConfig, vocab_size: int) -> Model:
    return RNN(cfg, vocab_size) if cfg.arch == "rnn" else Transformer(cfg, vocab_size)
