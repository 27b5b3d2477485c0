"""Sinusoidal positional encoding (paper section 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Sines on even dimensions and cosines on odd ones, interleaved as the paper writes it.
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
