"""Token-budget batches grouped by length (fairseq's --max-tokens), and their padding.

A batch holds sentences of similar length, and never more than `max_tokens` tokens on either
side counting padding (sentences x padded length). The order of batches is shuffled by
(seed, epoch), so a run can be resumed at any batch of any epoch.

Bounded shapes (`train.pad_to`, 8 by default): each side of a batch is padded to a length
from a fixed set, `bucket_length`: a multiple of 2 from 16 tokens, of 4 from 32, of 8 from 64
(never more than `pad_to`, and never more than 1/8 of the length). Every batch of every
epoch, on any corpus, then has one of at most 56 lengths a side up to 256 tokens, so a
compiled step or a kernel's plan made for a shape keeps being reused; padding grows by about
one to three points (BENCHMARKS.md, "The training step for GPUs, measured on the CPU"), where
a plain multiple of 8 added 16 points on Multi30k's short sentences.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, bucket_length


def token_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int | None = None,
    epoch: int = 0,
    pad_to: int = 1,
) -> list[np.ndarray]:
    """Indices of each batch, whose sentences padded to `bucket_length(longest, pad_to)` take
    at most `max_tokens` a side. With `seed`, ties in length are broken and batches ordered
    at random."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    n = len(src_lens)
    if seed is None:
        order = np.lexsort((tgt_lens, src_lens))
    else:
        rng = np.random.default_rng([seed, epoch])
        order = np.lexsort((rng.random(n), tgt_lens, src_lens))
    batches, start, longest = [], 0, 0
    padded = bucket_length(np.maximum(src_lens, tgt_lens)[order], pad_to)
    for i, length in enumerate(np.asarray(padded).tolist()):
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


def fixed_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int = 0,
    pad_to: int = 1,
) -> list[np.ndarray]:
    """Batches of a fixed set of shapes (`train.static_shapes`): the pairs whose longer side
    pads to length L (`bucket_length`) make batches of `fixed_rows(L, max_tokens)` pairs each,
    the last of each length fewer (`collate` pads it with empty pairs), so that every batch
    of every epoch is (rows(L), L) a side for one of the corpus's lengths L: after the first
    epoch no new shape comes. Pairs are shuffled within a length and the batches ordered at
    random by (seed, epoch)."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    padded = np.asarray(bucket_length(np.maximum(src_lens, tgt_lens), pad_to))
    rng = np.random.default_rng([seed, epoch])
    order = np.lexsort((rng.random(len(padded)), padded))
    batches = []
    for length in np.unique(padded).tolist():
        group = order[padded[order] == length]
        rows = fixed_rows(length, max_tokens)
        batches += [group[i : i + rows] for i in range(0, len(group), rows)]
    perm = np.random.default_rng([seed, epoch, 1]).permutation(len(batches))
    return [batches[j] for j in perm]


def fixed_rows(length: int, max_tokens: int) -> int:
    """The pairs of a static-shape batch whose sides pad to `length`."""
    return max(1, max_tokens // length)


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


@dataclass
class Batch:
    """A padded batch of pairs, what the training step and validation take (train/step.py).

    The bookkeeping that the step needs on the host comes with it, counted when it is made, so
    that the step never reads a device tensor back: the real token counts, and whether any
    source is padded (if none, attention needs no mask)."""

    src: Tensor  # (B, S) source ids, each ending in EOS, padded
    tgt_in: Tensor  # (B, T) BOS + target without its EOS: the decoder's inputs
    tgt_out: Tensor  # (B, T) target with its EOS: what the decoder predicts
    tgt_index: Tensor  # (N,) the flat positions in (B * T) where the loss is taken
    src_tokens: int  # real source tokens (padding not counted)
    tgt_tokens: int  # real target tokens
    src_padded: bool  # whether any source holds padding
    # guided alignment (train.align_weight): (K, 3) (row, target position, source position)
    # of each piece link, and (K,) its weight, 1 / the links of its target token
    align_index: Tensor | None = None
    align_weight: Tensor | None = None

    @property
    def padded_tokens(self) -> int:
        """Source and target tokens, padding included: what the batch's shapes hold."""
        return self.src.numel() + self.tgt_out.numel()

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory (a DataLoader's pin_memory calls this)."""
        tensors = ("src", "tgt_in", "tgt_out", "tgt_index", "align_index", "align_weight")
        return dataclasses.replace(
            self,
            **{k: getattr(self, k).pin_memory() for k in tensors if getattr(self, k) is not None},
        )


def collate(
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    pad_to: int = 1,
    fixed_tokens: int = 0,
    start: int = BOS_ID,
    links: list[np.ndarray] | None = None,
) -> Batch:
    """src (B, S); tgt_in = `start` (the decoder's first input, model.decoder_start) + target
    without its EOS (B, T); tgt_out = target with EOS (B, T);
    tgt_index (N,): the flat positions in (B * T) of the N target tokens (not padding); S and T
    are the longest lengths rounded up by `bucket_length`.

    With `fixed_tokens` (train.max_tokens, for `fixed_batches`), the batch has one of a fixed
    set of shapes: both sides padded to the longer one's length L, `fixed_rows(L)` rows (empty
    pairs added: a source of EOS alone, no target token), tgt_index every position and
    src_padded True (the loss skips padding by its target), so that nothing of the batch's
    shape depends on its contents but L. `links`: each pair's piece links (data/aligned.py),
    for guided alignment (`alignment_targets`)."""
    S = bucket_length(max(len(s) for s in src_ids), pad_to)
    T = bucket_length(max(len(t) for t in tgt_ids), pad_to)
    src_tokens, tgt_tokens = sum(len(s) for s in src_ids), sum(len(t) for t in tgt_ids)
    real = len(src_ids)
    if fixed_tokens:
        S = T = max(S, T)
        empty = fixed_rows(S, fixed_tokens) - real
        src_ids, tgt_ids = src_ids + [[EOS_ID]] * empty, tgt_ids + [[]] * empty
    src, tgt_out = pad(src_ids, length=S), pad(tgt_ids, length=T)
    tgt_in = pad([t[:-1] for t in tgt_ids], prefix=start, length=T)
    if fixed_tokens:
        tgt_index = torch.arange(tgt_out.numel())
    else:
        tgt_index = (tgt_out.flatten() != PAD_ID).nonzero().squeeze(1)
    align_index, align_weight = alignment_targets(links) if links is not None else (None, None)
    return Batch(
        src=src,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        tgt_index=tgt_index,
        src_tokens=src_tokens,
        tgt_tokens=tgt_tokens,
        src_padded=bool(fixed_tokens) or src_tokens < src.numel(),
        align_index=align_index,
        align_weight=align_weight,
    )


def alignment_targets(links: list[np.ndarray]) -> tuple[Tensor, Tensor]:
    """Each row's piece links (k, 2) (source position, target position) as one (K, 3) long
    tensor of (row, target position, source position), and (K,) float weights: 1 / the number
    of links of the link's target token, so that each aligned target token's weights sum to 1
    (Garg et al.'s normalised alignment distribution)."""
    parts = []
    for r, pairs in enumerate(links):
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        if len(pairs):
            parts.append(np.column_stack([np.full(len(pairs), r), pairs[:, 1], pairs[:, 0]]))
    if not parts:
        return torch.zeros(0, 3, dtype=torch.long), torch.zeros(0)
    index = np.concatenate(parts)
    _, inverse, counts = np.unique(index[:, :2], axis=0, return_inverse=True, return_counts=True)
    weight = 1.0 / counts[inverse.reshape(-1)]
    return torch.from_numpy(index), torch.from_numpy(weight.astype(np.float32))


class BatchDataset(torch.utils.data.Dataset):
    """Item i is padded batch i of a memory-mapped prepared split (for a DataLoader with
    batch_size=None, so workers build batches in the background)."""

    def __init__(
        self,
        ds,
        batches: list[np.ndarray],
        pad_to: int = 1,
        fixed_tokens: int = 0,
        resegment=None,
        start: int = BOS_ID,
        links=None,
    ) -> None:
        """`resegment`: a data/bpe_dropout.py `Resegment` for the epoch, to train on sampled
        segmentations instead of the prepared ones; `start`: the decoder's first input;
        `links`: the split's piece links (data/aligned.py's PieceLinks), for guided
        alignment."""
        self.ds = ds.select_columns(["src_ids", "tgt_ids"])
        self.batches = batches
        self.pad_to = pad_to
        self.fixed_tokens = fixed_tokens  # see collate
        self.resegment, self.start, self.links = resegment, start, links

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        rows = self.batches[i].tolist()
        batch = self.ds[rows]
        src_ids, tgt_ids = batch["src_ids"], batch["tgt_ids"]
        if self.resegment is not None:
            src_ids, tgt_ids = self.resegment(rows, batch)
        links = None if self.links is None else [self.links[r] for r in rows]
        return collate(src_ids, tgt_ids, self.pad_to, self.fixed_tokens, self.start, links)
