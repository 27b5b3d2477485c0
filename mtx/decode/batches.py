"""Translation batches: the one place that batches requests (request.py). Their sources are
sorted by length into batches of a source-token budget, each padded to a length of its own.

Each source is padded to its own `padded_length` (tokens.py), so a sentence is computed with
the same shapes, and so the same numbers, alone or in any batch. A batch may hold several
padded lengths (`Groups`, model/groups.py: decoded together, each group's encoder and
encoder-decoder attention on its own).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from mtx.data.batching import pad
from mtx.decode.request import Request, SearchBatch
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


def request_batches(
    requests: list[Request], max_tokens: int, device: torch.device, limit: int, mix: bool
) -> Iterator[tuple[SearchBatch, list[int]]]:
    """`requests` in batches (`source_batches`): each a `SearchBatch` on `device`, and the
    indices in `requests` of its rows, in order."""
    lengths = [len(r.source) for r in requests]
    for batch in source_batches(lengths, max_tokens, limit, mix):
        yield batch_requests(requests, batch, device)


def batch_requests(
    requests: list[Request], batch: SourceBatch, device: torch.device
) -> tuple[SearchBatch, list[int]]:
    """A batch's requests as a search reads them: their sources on `device`, each group padded
    to its length (a `Groups` of them for several lengths), and their indices, in order."""
    parts = [pad([list(requests[i].source) for i in idx], length=n).to(device) for n, idx in batch]
    rows = [i for _, idx in batch for i in idx]
    src = parts[0] if len(parts) == 1 else Groups(parts)
    return SearchBatch(src, [requests[i] for i in rows]), rows
