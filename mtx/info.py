"""`mtx info`: architecture, parameter count and FLOPs per token of a config or checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from mtx import corpora
from mtx.checkpoint import Checkpoint
from mtx.config import Config, ModelConfig, load_config
from mtx.model.build import make_model
from mtx.model.flops import forward_flops, training_flops_per_token
from mtx.model.transformer import count_parameters


def describe(
    target: str,
    overrides: list[str] | None = None,
    length: int = 32,
    parameters: int | None = None,
) -> dict:
    """Facts about a YAML config or a checkpoint; lengths for FLOPs are `length` tokens a side.
    `parameters`: the model's count where the caller holds it (else counted on a model built
    on the meta device, which costs a process about 70 MB that it keeps)."""
    if Path(target).suffix in (".pt", ".pth"):
        ckpt = Checkpoint.load(target)
        cfg: Config = ckpt.settings(overrides)
        vocab_size, step = ckpt.vocab_size, ckpt.step
        about = {
            "mtx_version": ckpt.mtx_version,
            "manifest": ckpt.manifest,
            "averaged_from": _json(ckpt.averaged_from),
            "init_from": _json(ckpt.init_from),
        }
    else:
        cfg, step, about = load_config(target, overrides), None, {}
        vocab_size = cfg.data.vocab_size
    params = parameters
    if params is None:
        with torch.device("meta"):
            params = count_parameters(make_model(cfg.model, vocab_size))
    m = cfg.model
    cs = corpora.corpora(cfg.data)
    return {
        "source": target,
        "architecture": architecture(m),
        "directions": list(dict.fromkeys(c.direction for c in cs)),
        "target_languages": corpora.target_languages(cfg.data),
        "tags": [corpora.tag_piece(lang) for lang in corpora.target_languages(cfg.data)]
        if corpora.tags(cfg.data)
        else [],
        "parameters": params,
        "vocab_size": vocab_size,
        "step": step,
        "flops_length": length,
        "forward_flops_per_pair": forward_flops(m, vocab_size, length, length),
        "flops_per_token": training_flops_per_token(m, vocab_size, length, length),
        "config": cfg.to_dict(),
        **about,
    }


def _json(value):
    """A checkpoint's record (a dataclass, or a list of them) as plain JSON values."""
    if isinstance(value, list):
        return [dataclasses.asdict(v) for v in value]
    return dataclasses.asdict(value) if value is not None else None


def architecture(m: ModelConfig) -> str:
    """One line naming the model a config describes."""
    if m.arch == "rnn":
        return (
            f"rnn {m.rnn_cell}, {m.encoder_layers}-layer bidirectional encoder, "
            f"{m.decoder_layers}-layer decoder with input feeding, d_model {m.d_model}, "
            f"{m.attention} attention, shared embeddings"
        )
    relative = m.positions == "relative"
    return (
        f"transformer {m.norm}-norm, {m.encoder_layers}+{m.decoder_layers} layers, "
        f"d_model {m.d_model}, d_ff {m.d_ff}, {m.n_heads} heads, shared embeddings, "
        f"{m.positions} positions"
        + (f" (distances clipped at {m.max_relative_position})" if relative else "")
    )
