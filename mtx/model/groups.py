"""Sources of several padded lengths decoded in one batch, each computed as if alone.

A sentence gets the same numbers alone or in any batch only if it is computed with the same
shapes: its source is always padded to the same length (decode/translator.py). A batch used
to hold one padded length, so a few concurrent sentences of different lengths were decoded
as several searches, each paying a decoder step's fixed cost (BENCHMARKS.md, "Serving").

`Groups` holds a batch's rows as consecutive groups, each a tensor of its own: the sources
(Bg, Sg) of one padded length, then their encoder output, source mask and cross-attention
keys/values. Everything row-wise (embeddings, self-attention over the target, the
feed-forward layers, the output projection, the search) runs on all rows at once; only what
reads the source (the encoder and the encoder-decoder attention) runs group by group, with
exactly the shapes the group would have alone.

Rows keep their order: selecting rows (sentences that leave the batch) takes an ascending
index and keeps each group's rows consecutive. The Transformer takes `Groups`
(`mixes_lengths`); a model without it is given one padded length per batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class Groups:
    def __init__(self, parts: list[Tensor]) -> None:
        if not parts:
            raise ValueError("Groups needs at least one group")
        self.parts = parts

    @property
    def sizes(self) -> list[int]:
        return [p.size(0) for p in self.parts]

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def size(self, dim: int) -> int:
        if dim != 0:
            raise ValueError("the groups differ in every dimension but the first")
        return sum(self.sizes)

    def map(self, f: Callable[[Tensor], Tensor]) -> Groups:
        return Groups([f(p) for p in self.parts])

    def split(self, x: Tensor, per_row: int = 1) -> list[Tensor]:
        """Rows of `x` (first dimension `per_row` times this batch's rows: a sentence's beams)
        cut into the groups' row ranges, as views."""
        return list(x.split([n * per_row for n in self.sizes]))

    def index_select(self, dim: int, index: Tensor) -> Groups:
        """The rows `index` (ascending; a row repeated is copied) of every group; groups left
        with no row are dropped."""
        if dim != 0:
            raise ValueError("Groups selects rows (dimension 0) only")
        rows = index.tolist()
        if rows != sorted(rows):
            raise ValueError("Groups selects rows in ascending order, keeping the groups")
        out, start, i = [], 0, 0
        for part in self.parts:
            end, mine = start + part.size(0), []
            while i < len(rows) and rows[i] < end:
                mine.append(rows[i] - start)
                i += 1
            if mine == list(range(part.size(0))):
                out.append(part)
            elif mine:
                out.append(part.index_select(0, torch.tensor(mine, device=part.device)))
            start = end
        if i != len(rows):
            raise IndexError(f"row {rows[i]} is out of range for {start} rows")
        return Groups(out)

    def __getitem__(self, index: Tensor) -> Groups:
        return self.index_select(0, index)

    def repeat_interleave(self, repeats: int, dim: int = 0) -> Groups:
        return self.map(lambda p: p.repeat_interleave(repeats, dim))

    def contiguous(self) -> Groups:
        return self.map(Tensor.contiguous)


Attend = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]


def attend_groups(q: Tensor, k: Groups, v: Groups, mask: Groups | None, attend: Attend) -> Tensor:
    """Attention of queries q (B, H, T, d_k) over the keys and values of each group (B / G
    rows in all; G query rows per key row, a sentence's beams), group by group:
    `attend(q_part, k_part, v_part, mask_part)` -> (rows, T, d_model), concatenated."""
    G = q.size(0) // k.size(0)
    masks = [None] * len(k.parts) if mask is None else mask.parts
    return torch.cat([attend(*part) for part in zip(k.split(q, G), k.parts, v.parts, masks)])


def attend_folded_groups(
    q: Tensor, k: Groups, v: Groups, mask: Groups | None, attention: Attend
) -> Tensor:
    """`attend_groups` in inference, with the queries arranged and the output put back once
    for all groups (a decoding step's fixed cost): `attention(q_part, k_part, v_part,
    mask_part)` takes a group's queries (n, H, G * T, d_k), a sentence's beams as one query,
    and gives (n, H, G * T, d_k). Returns (B, T, H * d_k)."""
    B, H, T, d_k = q.shape
    G = B // k.size(0)
    q = q.reshape(-1, G, H, T, d_k).transpose(1, 2).reshape(-1, H, G * T, d_k)
    masks = [None] * len(k.parts) if mask is None else mask.parts
    out, row = [], 0
    for k_part, v_part, m in zip(k.parts, v.parts, masks):
        n = k_part.size(0)
        m = m.unsqueeze(1) if m is not None and m.dim() == 3 else m
        out.append(attention(q[row : row + n], k_part, v_part, m))
        row += n
    out = torch.cat(out).view(-1, H, G, T, d_k).transpose(1, 2)  # (B / G, G, H, T, d_k)
    return out.transpose(2, 3).reshape(B, T, H * d_k)
