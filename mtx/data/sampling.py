"""Subword regularisation on the fly: BPE-dropout (Provilkov et al. 2020) by SentencePiece's
sampling, a new segmentation of every training pair in every epoch (data.sampling).

The segmentation of pair i (its row in the prepared data) in epoch e is a function of
(train.seed, e, i) alone: SentencePiece's generator is seeded with a hash of the three before
the pair is encoded. So it is the same on every process, after a resume and for any number
of loader workers, and two epochs segment a pair differently. Validation, test and
translation read the prepared (deterministic) segmentation and never sample.

Sampled segmentations are longer than the prepared ones (at alpha 0.1 on Multi30k, by about
a third: BENCHMARKS.md), and batches are formed from the prepared lengths. So `growth`
measures, once at the start and the same on every process, how much sampling grows batches
of the run's own data (the first 2,000 pairs, epoch 0): the trainer forms batches with
train.max_tokens divided by the padded growth, so that a sampled batch's padded size is
about train.max_tokens, and divides an update's loss by its prepared target tokens times
the target tokens' growth (a count every process knows without exchanging one; within a few
percent of the sampled count). A sampled side longer than data.max_len keeps its prepared
segmentation.
"""

from __future__ import annotations

import copy

import sentencepiece as spm

from mtx.data import vocab
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.tokens import EOS_ID

MASK = (1 << 32) - 1


def pair_seed(seed: int, epoch: int, row: int) -> int:
    """A 32-bit seed for SentencePiece's generator from (seed, epoch, row) (splitmix64's
    finaliser over the three folded together)."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + row) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (x ^ (x >> 31)) & MASK


class Resegment:
    """Sampled segmentations of training pairs: `for_epoch(e)(rows, batch)` gives the batch's
    src_ids and tgt_ids. Pickles as the model proto: each loader worker loads its own."""

    def __init__(
        self, spm_proto: bytes, alpha: float, seed: int, tagged: bool, max_len: int
    ) -> None:
        self.proto, self.alpha, self.seed = spm_proto, alpha, seed
        self.tagged, self.max_len = tagged, max_len
        self.epoch, self.sp = 0, None
        self.tgt_ratio = 1.0  # target tokens sampled per prepared token, once measured (growth)

    def __getstate__(self) -> dict:
        return self.__dict__ | {"sp": None}

    def for_epoch(self, epoch: int) -> Resegment:
        other = copy.copy(self)
        other.epoch = epoch
        return other

    def growth(self, ds, max_tokens: int, pad_to: int, n: int = 2000) -> tuple[float, float]:
        """How much sampling grows batches, over the first `n` pairs of `ds` in epoch 0 made
        into batches of `max_tokens`: (padded tokens of the fuller side, sampled per
        prepared; target tokens sampled per prepared)."""
        ds = ds.select(range(min(n, len(ds))))
        src_lens, tgt_lens = lengths(ds)
        batches = token_batches(src_lens, tgt_lens, max_tokens, 0, 0, pad_to)
        prepared = BatchDataset(ds, batches, pad_to)
        grown = BatchDataset(ds, batches, pad_to, resegment=self.for_epoch(0))
        before, after = [0, 0, 0], [0, 0, 0]
        for i in range(len(batches)):
            for total, b in ((before, prepared[i]), (after, grown[i])):
                total[0] += b["src"].numel()
                total[1] += b["tgt_out"].numel()
                total[2] += b["tgt_tokens"]
        return max(after[0] / before[0], after[1] / before[1]), after[2] / before[2]

    def encode(self, text: str, row: int, side: int) -> list[int]:
        """One side of pair `row` sampled (side 0: source, 1: target)."""
        if self.sp is None:
            self.sp = vocab.load(self.proto)
        spm.set_random_generator_seed(pair_seed(self.seed, self.epoch, 2 * row + side))
        return self.sp.encode(text, enable_sampling=True, alpha=self.alpha, nbest_size=-1)

    def __call__(self, rows: list[int], batch: dict[str, list]) -> tuple[list, list]:
        """The batch's (src_ids, tgt_ids): each side sampled, with EOS (and the source's tag)."""
        src_out, tgt_out = [], []
        for k, row in enumerate(rows):
            prepared_src, prepared_tgt = batch["src_ids"][k], batch["tgt_ids"][k]
            prefix = prepared_src[:1] if self.tagged else []
            src = prefix + self.encode(batch["src"][k], row, 0) + [EOS_ID]
            tgt = self.encode(batch["tgt"][k], row, 1) + [EOS_ID]
            src_out.append(src if len(src) - 1 <= self.max_len else prepared_src)
            tgt_out.append(tgt if len(tgt) - 1 <= self.max_len else prepared_tgt)
        return src_out, tgt_out
