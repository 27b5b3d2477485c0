"""Sinusoidal positional encoding (paper section 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Sines on even dimensions and cosines on odd ones, interleaved as the paper writes it.

fairseq's table (`model.positions: fairseq`, that of M2M100 and NLLB models) differs in three
ways: the d/2 sines come first and the d/2 cosines after them; the frequencies are
10000^(-i / (d/2 - 1)), i = 0 .. d/2 - 1 (the last one exactly 1/10000); and positions are
counted from padding id + 1 = 2, so the first token reads row 2.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mtx.config import ModelConfig


def relative_distance(cfg: ModelConfig) -> int | None:
    """The largest distance relative positions tell apart (None: no relative positions)."""
    return cfg.max_relative_position if cfg.positions == "relative" else None


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model) float32 table; row `pos` is the encoding of position `pos`."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    angle = pos * torch.exp(-math.log(10000.0) * two_i / d_model)  # (L, d_model/2)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


FAIRSEQ_FIRST_POSITION = 2  # fairseq's padding id (1) + 1


def fairseq_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model) float32: row `pos` is fairseq's encoding of position `pos` + 2."""
    half = d_model // 2
    step = math.log(10000.0) / (half - 1)
    # in float32, as fairseq computes it, so that the table is fairseq's to the bit
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -step)
    pos = torch.arange(FAIRSEQ_FIRST_POSITION, FAIRSEQ_FIRST_POSITION + max_len)
    angle = pos.to(torch.float32).unsqueeze(1) * freq
    return torch.cat([torch.sin(angle), torch.cos(angle)], 1)


def position_table(cfg: ModelConfig) -> Tensor | None:
    """The fixed table of `model.positions` (None: learned or relative positions)."""
    if cfg.positions == "sinusoidal":
        return sinusoidal_table(cfg.max_positions, cfg.d_model)
    if cfg.positions == "fairseq":
        return fairseq_table(cfg.max_positions, cfg.d_model)
    return None
