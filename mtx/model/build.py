"""The model a config names: `model.arch` transformer (transformer.py) or rnn (rnn.py), new or
with a checkpoint's weights."""

from __future__ import annotations

from pathlib import Path

from mtx.checkpoint import Checkpoint
from mtx.config import Config, ModelConfig
from mtx.errors import MtxError
from mtx.model.rnn import RNN
from mtx.model.transformer import Transformer

Model = Transformer | RNN


def make_model(cfg: ModelConfig, vocab_size: int) -> Model:
    return RNN(cfg, vocab_size) if cfg.arch == "rnn" else Transformer(cfg, vocab_size)


def checkpoint_model(ckpt: Checkpoint, cfg: Config, path: str | Path) -> Model:
    """The model of `cfg` (a checkpoint's settings) with the checkpoint's weights, in eval mode
    on the CPU; `path` names the checkpoint in the error."""
    model = make_model(cfg.model, ckpt.vocab_size)
    try:
        model.load_state_dict(ckpt.model)
    except RuntimeError:
        raise MtxError(
            f"{path}: its weights do not fit the model config (were model.* keys overridden?)"
        ) from None
    return model.eval()


def load_model(path: str | Path, overrides: list[str] | None = None) -> tuple[Model, Config, bytes]:
    """The model of a checkpoint file (eval mode, on CPU), its config with `overrides` applied,
    and its SentencePiece model."""
    ckpt = Checkpoint.load(path)
    cfg = ckpt.settings(overrides)
    return checkpoint_model(ckpt, cfg, path), cfg, ckpt.spm_model
