"""What a decoder keeps between the steps of incremental decoding: one type per kind of cache.

Shape legend: N hypothesis rows (B sentences x K beams), B sentences, H heads, d_k = d_model /
H, t positions decoded so far, S source length, L a static cache's positions, d = d_model.

A search (decode/) decodes one position at a time. What the decoder computed at the positions
before (the Transformer's self-attention keys and values, the RNN's states) lives here, one row
per hypothesis, and so does what it computed once from the encoder output (the
encoder-decoder attention's keys and values, the RNN's encoder states and their attention
keys), one row per sentence, shared by the sentence's beams:

- `GrowingCache` (the Transformer): each step's keys and values are appended, so the cache
  grows by one position a step;
- `StaticCache` (the Transformer, decode/static.py): allocated once for a whole search and
  written in place at a position held on the device, so that every step has the same shapes
  and touches the same memory (what a CUDA graph replays);
- `RecurrentState` (the RNN, model/rnn.py): each decoder layer's state and the fed h~.

Every kind offers a search the same two operations (`DecoderCache`): `reorder(rows)` keeps the
hypothesis rows `rows`, in that order (the beams that continue), and `select(sentences)` keeps
the per-sentence rows of `sentences` (sentences that leave the batch). An ensemble's cache
holds one of these per model (decode/ensemble.py).

A Transformer decoder layer's attention reads and writes its own part, a `LayerCache`
(`GrowingLayer` or `StaticLayer`): `length` (positions decoded before this step), `append(k,
v, mask)` (this step's keys and values in; what the queries attend over out) and
`memory(project, memory)` (the encoder output's keys and values, computed once). A layer whose
self-attention is an SSRU (model/ssru.py) keeps its cell instead of keys and values:
`cell()` and `keep_cell(cell, positions)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from mtx.model.groups import Groups

KeysValues = tuple[Tensor, Tensor]  # (rows, H, positions, d_k) each; Groups of them for a memory
Project = Callable[[Tensor | Groups], tuple]  # the encoder output -> its keys and values
Attend = Callable[..., Tensor]  # (q, keys, values, mask, start) -> the attention (N, T, d_model)


class DecoderCache(Protocol):
    """What a search does with any model's cache between steps."""

    def reorder(self, rows: Tensor) -> None:
        """Keep hypothesis rows `rows` (N',), in this order: the beams that continue."""

    def select(self, sentences: Tensor) -> None:
        """Keep the per-sentence rows `sentences` (B',), ascending: the sentences still decoded."""


class LayerCache(Protocol):
    """What a Transformer decoder layer's attention reads and writes."""

    @property
    def length(self) -> int | Tensor:
        """Positions decoded before this step: the position of the step's first query."""

    def append(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple:
        """Add this step's keys and values k, v (N, H, T, d_k); returns all the keys and values
        the step's queries attend over and their mask (True = attend)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attend: Attend):
        """This step's attention: its queries q and new keys and values k, v (N, H, T, d_k)
        with `mask` (True = attend) given to `attend(q, keys, values, mask, start)` over the
        keys and values they read (`append`), `start` the position of the first query."""

    def memory(self, project: Project, memory: Tensor | Groups | None) -> KeysValues:
        """The keys and values of the encoder output, `project(memory)` the first time."""

    def cell(self) -> Tensor | None:
        """An SSRU's cell (N, d) after the positions decoded so far; None before the first."""

    def keep_cell(self, cell: Tensor, positions: int) -> None:
        """The SSRU's cell after this step's `positions` positions."""


class GrowingLayer:
    """One decoder layer's growing cache."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (N, H, t, d_k) self-attention keys of the positions so far
        self.v: Tensor | None = None
        self.state: Tensor | None = None  # (N, d) an SSRU's cell, in place of k and v
        self.memory_k: Tensor | Groups | None = None  # (B, H, S, d_k) encoder output's keys
        self.memory_v: Tensor | Groups | None = None
        self.positions = 0

    @property
    def length(self) -> int:
        return self.positions

    def append(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple:
        self.positions += k.size(2)
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v, mask

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attend: Attend):
        start = self.positions
        return attend(q, *self.append(k, v, mask), start)

    def cell(self) -> Tensor | None:
        return self.state

    def keep_cell(self, cell: Tensor, positions: int) -> None:
        self.state, self.positions = cell, self.positions + positions

    def memory(self, project: Project, memory: Tensor | Groups | None) -> KeysValues:
        if self.memory_k is None:  # contiguous once, not copied at every step
            k, v = project(memory)
            self.memory_k, self.memory_v = k.contiguous(), v.contiguous()
        return self.memory_k, self.memory_v


class GrowingCache:
    """A Transformer decoder's cache that grows by the positions each step decodes (the
    shrinking search, decode/search.py)."""

    def __init__(self, layers: int) -> None:
        self.layers = [GrowingLayer() for _ in range(layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def reorder(self, rows: Tensor) -> None:
        for layer in self.layers:
            if layer.k is not None:
                layer.k, layer.v = layer.k.index_select(0, rows), layer.v.index_select(0, rows)
            if layer.state is not None:
                layer.state = layer.state.index_select(0, rows)

    def select(self, sentences: Tensor) -> None:
        for layer in self.layers:
            if layer.memory_k is not None:
                layer.memory_k = layer.memory_k.index_select(0, sentences)
                layer.memory_v = layer.memory_v.index_select(0, sentences)


class StaticLayer:
    """One decoder layer's part of a `StaticCache`."""

    def __init__(self, owner: StaticCache, k: Tensor, v: Tensor, state: Tensor | None) -> None:
        self.owner = owner
        self.k, self.v = k, v  # (N, H, L, d_k), written at owner.position
        self.state = state  # (N, d) an SSRU's cell (k and v then hold no positions)
        self.memory_k: Tensor | None = None  # (B, H, S, d_k), written by `write_memory`
        self.memory_v: Tensor | None = None

    @property
    def length(self) -> Tensor:
        return self.owner.position

    def append(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple:
        """Write one position's k, v (N, H, 1, d_k) at the cache's position; the first
        `window` positions are attended over, those not yet written masked (`visible`)."""
        assert mask is None, "a static cache decodes one position at a time"
        where = self.owner.position.view(1)
        self.k.index_copy_(2, where, k.to(self.k.dtype))
        self.v.index_copy_(2, where, v.to(self.v.dtype))
        n = self.owner.window_length
        visible = self.owner.visible[:n].view(1, 1, 1, n) if self.owner.full else None
        return self.k[:, :, :n], self.v[:, :, :n], visible

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attend: Attend):
        return attend(q, *self.append(k, v, mask), self.owner.position)

    def memory(self, project: Project, memory: Tensor | Groups | None) -> KeysValues:
        return self.memory_k, self.memory_v

    def cell(self) -> Tensor:
        return self.state  # zero before the first position (`StaticCache.restart`)

    def keep_cell(self, cell: Tensor, positions: int) -> None:
        assert positions == 1, "a static cache decodes one position at a time"
        self.state.copy_(cell)

    def write_memory(self, k: Tensor, v: Tensor) -> None:
        """The encoder output's keys and values, in place where the tensors exist (a captured
        CUDA graph reads these very tensors)."""
        if self.memory_k is None:
            self.memory_k, self.memory_v = k.contiguous(), v.contiguous()
        else:
            self.memory_k.copy_(k)
            self.memory_v.copy_(v)


class StaticCache:
    """A Transformer decoder's cache allocated once for a whole search: per layer, the
    self-attention keys and values (N, H, L, d_k), written in place at `position` (a () long
    tensor on the device), or with `cell_width` d a recurrence's (an SSRU's) cell (N, d,
    float32 as its recurrence), and the encoder output's keys and values, written before the
    first step. A
    step's shapes then depend only on its window (below), and it touches the same memory
    every time, so that a CUDA graph can replay it (decode/static.py).

    A step at position t attends over, and reorders, the first `window(t)` positions: with
    `full`, t + 1 rounded up to a multiple of WINDOW, those not yet written masked
    (`visible`), so that a few shapes serve a whole search; without, exactly t + 1, which
    computes the same numbers as a `GrowingCache`. The positions beyond are never read:
    copying the whole cache at every beam reordering cost the CPU most of its time."""

    WINDOW = 16

    def __init__(
        self,
        layers: int,
        rows: int,
        H: int,
        length: int,
        d_k: int,
        full: bool,
        like: Tensor,
        cell_width: int = 0,
    ) -> None:
        kw = {"dtype": like.dtype, "device": like.device}
        self.size, self.full = length, full
        self.position = torch.zeros((), dtype=torch.long, device=like.device)
        self.slots = torch.arange(length, device=like.device)
        self.visible = self.slots == 0  # (L,) True at the positions written so far
        self.window_length = 1  # positions the current step reads (a host int)
        kept = 0 if cell_width else length  # a recurrence (an SSRU) keeps no keys and values
        self.layers = [
            StaticLayer(
                self,
                torch.zeros(rows, H, kept, d_k, **kw),
                torch.zeros(rows, H, kept, d_k, **kw),
                torch.zeros(rows, cell_width, device=like.device) if cell_width else None,
            )
            for _ in range(layers)
        ]

    @property
    def length(self) -> Tensor:
        return self.position

    def window(self, position: int) -> int:
        """How many positions a step at `position` reads (see above)."""
        if not self.full:
            return position + 1
        return min(self.size, -(-(position + 1) // self.WINDOW) * self.WINDOW)

    def start(self, position: int) -> None:
        """Before the step at `position` (the host's count; the device's is `self.position`)."""
        self.window_length = self.window(position)
        if self.full:
            torch.le(self.slots, self.position, out=self.visible)

    def reorder(self, rows: Tensor) -> None:
        """Keep rows `rows` of the keys and values written so far, in place."""
        for layer in self.layers:
            if layer.state is not None:
                layer.state.copy_(layer.state.index_select(0, rows))
                continue
            for kv in (layer.k, layer.v):
                part = kv[:, :, : self.window_length]
                part.copy_(part.index_select(0, rows))

    def select(self, sentences: Tensor) -> None:
        raise ValueError("a static cache keeps its rows: its search masks finished sentences")

    def advance(self) -> None:
        self.position.add_(1)

    def restart(self) -> None:
        """A new search over the same tensors: back to position 0 (and SSRU cells to 0)."""
        self.position.zero_()
        for layer in self.layers:
            if layer.state is not None:
                layer.state.zero_()


class RecurrentState:
    """The RNN decoder's state between steps (model/rnn.py): each layer's h and c (None for a
    GRU) and the fed h~ (N, d), one row per hypothesis; the encoder states and their attention
    keys (B, S, d), one row per sentence."""

    def __init__(self) -> None:
        self.hs: list[Tensor] | None = None  # None: nothing decoded yet
        self.cs: list[Tensor | None] = []
        self.feed: Tensor | None = None
        self.memory: Tensor | None = None
        self.keys: Tensor | None = None

    def reorder(self, rows: Tensor) -> None:
        if self.hs is None:
            return
        self.hs = [h.index_select(0, rows) for h in self.hs]
        self.cs = [None if c is None else c.index_select(0, rows) for c in self.cs]
        self.feed = self.feed.index_select(0, rows)

    def select(self, sentences: Tensor) -> None:
        if self.memory is not None:
            self.memory = self.memory.index_select(0, sentences)
            self.keys = self.keys.index_select(0, sentences)
