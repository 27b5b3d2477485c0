"""Token-budget batches grouped by length (fairseq's --max-tokens), and their padding.

A batch holds sentences of similar length, and never more than `max_tokens` tokens on either
side counting padding (sentences x longest sentence). The order of batches is shuffled by
(seed, epoch), so a run can be resumed at any batch of any epoch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtx.tokens import BOS_ID, PAD_ID


def token_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int | None = None,
    epoch: int = 0,
) -> list[np.ndarray]:
    """Indices of each batch. With `seed`, ties in length are broken and batches ordered at random."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    n = len(src_lens)
    if seed is None:
        order = np.lexsort((tgt_lens, src_lens))
    else:
        rng = np.random.default_rng([seed, epoch])
        order = np.lexsort((rng.random(n), tgt_lens, src_lens))
    batches, start, longest = [], 0, 0
    for i, length in enumerate(np.maximum(src_lens, tgt_lens)[order].tolist()):
        if i > start and max(longest, length) * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, longest = i, 0
        longest = max(longest, length)
    if n > start:
        batches.append(order[start:])
    if seed is not None:
        perm = np.random.default_rng([seed, epoch, 1]).permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches


def lengths(ds) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths of a prepared split, read straight from its Arrow table."""
    return ds.data.column("src_len").to_numpy(), ds.data.column("tgt_len").to_numpy()


def pad(seqs: list[list[int]], prefix: int | None = None, length: int = 0) -> Tensor:
    """Right-pad id lists into (B, n) int64, n at least `length`, optionally prepending `prefix`
    to each."""
    extra = prefix is not None
    n = max(length, max(len(s) for s in seqs) + extra)
    out = torch.full((len(seqs), n), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        if extra:
            out[i, 0] = prefix
        out[i, extra : extra + len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def collate(src_ids: list[list[int]], tgt_ids: list[list[int]]) -> dict[str, Tensor]:
    """src (B, S); tgt_in = BOS + target without its EOS (B, T); tgt_out = target with EOS (B, T);
    tgt_index (N,): the flat positions in (B * T) of the N target tokens (not padding)."""
    tgt_out = pad(tgt_ids)
    tgt_in = pad([t[:-1] for t in tgt_ids], prefix=BOS_ID)
    tgt_index = (tgt_out.flatten() != PAD_ID).nonzero().squeeze(1)
    return {"src": pad(src_ids), "tgt_in": tgt_in, "tgt_out": tgt_out, "tgt_index": tgt_index}


class BatchDataset(torch.utils.data.Dataset):
    """Item i is padded batch i of a memory-mapped prepared split (for a DataLoader with
    batch_size=None, so workers build batches in the background)."""

    def __init__(self, ds, batches: list[np.ndarray]) -> None:
        self.ds = ds.select_columns(["src_ids", "tgt_ids"])
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        rows = self.ds[self.batches[i].tolist()]
        return collate(rows["src_ids"], rows["tgt_ids"])
