"""A decoder cache whose rows stand at positions of their own: what speculative decoding
(decode/speculative.py) keeps for the model it verifies with and for its draft.

Shape legend: N cache rows (sentences), Q query rows of one decoder call, H heads, d_k =
d_model / H, C positions a row may hold, S source length, d = d_model.

The growing cache (cache.py) holds every row at the same position: a step decodes one
position of every row. Under speculative decoding the rows accept drafts of different lengths,
so each row stands where it stands, and a verifying call reads several positions of one row.
A call of `decode` here reads Q query rows of one position each, as `feed` says: query row i
is cache row `rows[i]` at position `positions[i]`; the keys and values (or an SSRU's cells) of
every query are written at their row and position first, then each query attends over its
row's positions up to its own. So a row's positions decoded in one verifying call see each
other as they would have, decoded one call at a time.

Every query is computed with exactly the shapes a step of greedy search gives it: the queries
at one position are one attention call (one query each, over that position's keys), as the
rows of a greedy step are; the matrix products run on all Q rows at once, which gives each row
the numbers it gets alone (model/rows.py, model/packed.py). A verifying call then gives every
position bit for bit the log-probabilities greedy search computes there, which is what makes
speculative greedy search exact (tests/test_speculative.py).

Nothing is ever taken back: a row whose drafts were rejected simply stands at an earlier
position at the next call, and the keys and values written beyond it are never read (each
query reads positions up to its own) before they are written again. The first call (`prefill`:
the decoder's start tokens, every row from position 0) is computed as a growing cache's
first step is.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.model.cache import Attend, KeysValues, Project
from mtx.model.groups import Groups


class RaggedCache:
    """See the module's docstring. `capacity`: the positions a row may hold."""

    def __init__(self, layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.layers = [RaggedLayer(self) for _ in range(layers)]
        self.prefill = True  # until the first `feed`: the start tokens, a growing cache's step
        self.rows: Tensor | None = None  # (Q,) each query's cache row; None: row i is row i
        self.positions = torch.zeros(0, dtype=torch.long)  # (Q,) each query's position
        # the queries at each position, in ascending order of position
        self.groups: list[_Group] = []
        self.pattern: tuple[int, ...] = ()  # the rows of the queries, as `rows` (host)
        self.repeats = False

    @property
    def length(self) -> int | Tensor:
        """The first call's position (0), then each query's position (Q,)."""
        return 0 if self.prefill else self.positions

    def feed(self, rows: list[int], positions: list[int], n_rows: int, device) -> None:
        """The next call's queries: query i is cache row `rows[i]` (ascending; `n_rows`
        rows in the cache) at position `positions[i]`; a row's positions are consecutive."""
        if max(positions) >= self.capacity:
            raise ValueError(f"position {max(positions)} is beyond the cache's {self.capacity}")
        self.prefill = False
        identity = rows == list(range(n_rows))
        self.repeats = len(set(rows)) < len(rows)  # a row read at several positions
        self.rows = None if identity else torch.tensor(rows, device=device)
        self.positions = torch.tensor(positions, device=device)
        self.pattern = tuple(rows)
        by_position: dict[int, list[int]] = {}
        for i, p in enumerate(positions):
            by_position.setdefault(p, []).append(i)
        self.groups = [_Group(p, queries, [rows[i] for i in queries], device)
                       for p, queries in sorted(by_position.items())]  # fmt: skip

    def select(self, rows: Tensor) -> None:
        """Keep cache rows `rows` (ascending): the sentences still decoded."""
        for layer in self.layers:
            layer.select(rows)

    reorder = select  # one row a sentence: keeping hypotheses is keeping sentences


class _Group:
    """The queries of one call at one position: their indices and cache rows."""

    def __init__(self, position: int, queries: list[int], rows: list[int], device) -> None:
        self.position = position
        self.queries = torch.tensor(queries, device=device)
        self.rows = torch.tensor(rows, device=device)
        self.one = (queries[0], rows[0]) if len(queries) == 1 else None  # a query alone

    def keys(self, x: Tensor) -> Tensor:
        """Its rows' positions up to its own of `x` (N, H, C, d_k), contiguous."""
        p = self.position + 1
        if self.one is not None:
            row = self.one[1]
            return x[row : row + 1, :, :p].contiguous()
        return x[:, :, :p].index_select(0, self.rows)


class RaggedLayer:
    """One decoder layer's part of a `RaggedCache`."""

    def __init__(self, owner: RaggedCache) -> None:
        self.owner = owner
        self.k: Tensor | None = None  # (N, H, C, d_k) keys by row and position
        self.v: Tensor | None = None
        self.cells: Tensor | None = None  # (N, C, d) an SSRU's cell after each position
        self.memory_k: Tensor | Groups | None = None  # (N, H, S, d_k) encoder output's keys
        self.memory_v: Tensor | Groups | None = None
        # the memory's keys and values of the last call's query rows, and their pattern
        self.expanded: tuple[tuple[int, ...], Tensor | Groups, Tensor | Groups] | None = None

    @property
    def length(self) -> int | Tensor:
        return self.owner.length

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attend: Attend):
        owner = self.owner
        if owner.prefill:  # (N, H, n, d_k): positions 0..n-1 of every row, as a growing cache
            N, H, n, d_k = k.shape
            self.k = k.new_zeros(N, H, owner.capacity, d_k)
            self.v = v.new_zeros(N, H, owner.capacity, d_k)
            self.k[:, :, :n], self.v[:, :, :n] = k, v
            return attend(q, k, v, mask, 0)
        rows = torch.arange(q.size(0), device=q.device) if owner.rows is None else owner.rows
        self.k[rows, :, owner.positions] = k[:, :, 0]  # (Q, H, d_k) each
        self.v[rows, :, owner.positions] = v[:, :, 0]
        if len(owner.groups) == 1:  # every query at one position: a greedy step
            group = owner.groups[0]
            return attend(q, group.keys(self.k), group.keys(self.v), None, group.position)
        out = None
        for group in owner.groups:
            keys, values = group.keys(self.k), group.keys(self.v)
            if group.one is not None:
                i = group.one[0]
                part = attend(q[i : i + 1], keys, values, None, group.position)  # (1, 1, d)
            else:
                queries = q.index_select(0, group.queries)
                part = attend(queries, keys, values, None, group.position)  # (n, 1, d)
            if out is None:
                out = part.new_empty(q.size(0), *part.shape[1:])
            if group.one is not None:
                out[group.one[0]] = part[0]
            else:
                out.index_copy_(0, group.queries, part)
        return out

    def memory(self, project: Project, memory: Tensor | Groups | None) -> KeysValues:
        """The encoder output's keys and values of each query's row."""
        if self.memory_k is None:
            k, v = project(memory)
            self.memory_k, self.memory_v = k.contiguous(), v.contiguous()
        owner = self.owner
        if owner.rows is None:
            return self.memory_k, self.memory_v
        if self.expanded is None or self.expanded[0] != owner.pattern:  # kept while it repeats
            rows = owner.rows
            k, v = self.memory_k.index_select(0, rows), self.memory_v.index_select(0, rows)
            self.expanded = (owner.pattern, k, v)
        return self.expanded[1], self.expanded[2]

    def cell(self) -> Tensor | None:
        """Each query's SSRU cell: its row's after the position before its own."""
        owner = self.owner
        if owner.prefill:
            return None
        rows = owner.rows
        if rows is None:
            rows = torch.arange(owner.positions.numel(), device=owner.positions.device)
        return self.cells[rows, owner.positions - 1]

    def keep_cell(self, cell: Tensor, positions: int) -> None:
        owner = self.owner
        if owner.prefill:  # the cell after the start tokens (no later call reads earlier ones)
            self.cells = cell.new_zeros(cell.size(0), owner.capacity, cell.size(1))
            self.cells[:, positions - 1] = cell
            return
        if owner.repeats:
            raise ValueError("a recurrence reads one position of a row per call")
        rows = owner.rows
        if rows is None:
            rows = torch.arange(cell.size(0), device=cell.device)
        self.cells[rows, owner.positions] = cell

    def select(self, rows: Tensor) -> None:
        def keep(x):
            return None if x is None else x.index_select(0, rows)

        self.expanded = None
        self.k, self.v, self.cells = keep(self.k), keep(self.v), keep(self.cells)
        self.memory_k, self.memory_v = keep(self.memory_k), keep(self.memory_v)
