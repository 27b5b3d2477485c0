"""Translation batches: the lines sorted by length into batches of a source-token budget,
each source padded to a length of its own.

Each source is padded to its own `padded_length` (tokens.py), so a sentence is computed with
the same shapes, and so the same numbers, alone or in any batch. A batch may hold several
padded lengths (`Groups`, model/groups.py: decoded together, each group's encoder and
encoder-decoder attention on its own).
"""

from __future__ import annotations

import torch

from mtx.data.batching import pad
from mtx.model.groups import Groups
from mtx.tokens import padded_length

SourceBatch = list[tuple[int, list[int]]]  # groups of (padded source length, line indices)


def source_batches(
    lengths: list[int], max_tokens: int, limit: int = 1 << 30, mix: bool = True
) -> list[SourceBatch]:
    """Translation batches, shortest sources first: each a list of groups (padded length, line
    indices), ascending in length. A batch holds at most `max_tokens` padded source tokens (at
    least one source); with `mix` it may hold several padded lengths, without it one."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[SourceBatch] = []
    tokens = 0
    for i in order:
        padded = padded_length(lengths[i], limit)
        batch = batches[-1] if batches else None
        if batch is None or tokens + padded > max_tokens or (not mix and batch[-1][0] != padded):
            batches.append([(padded, [i])])
            tokens = padded
            continue
        if batch[-1][0] == padded:
            batch[-1][1].append(i)
        else:
            batch.append((padded, [i]))
        tokens += padded
    return batches


def batch_sources(
    ids: list[list[int]], batch: SourceBatch, device: torch.device
) -> tuple[torch.Tensor | Groups, list[int]]:
    """A batch's sources on `device`, each group padded to its length (a `Groups` of them for
    several lengths), and the lines of its rows, in order."""
    parts = [pad([ids[i] for i in idx], length=n).to(device) for n, idx in batch]
    rows = [i for _, idx in batch for i in idx]
    return (parts[0] if len(parts) == 1 else Groups(parts)), rows
