"""Subword regularisation on the fly: BPE-dropout (Provilkov et al. 2020) by SentencePiece's
sampling, a new segmentation of every training pair in every epoch (data.sampling).

The segmentation of pair i (its row in the prepared data) in epoch e is a function of
(train.seed, e, i) alone: SentencePiece's generator is seeded with a hash of the three before
the pair is encoded. So it is the same on every process, after a resume and for any number
of loader workers, and two epochs segment a pair differently. Validation, test and
translation read the prepared (deterministic) segmentation and never sample.

Batches are formed from the prepared lengths, so a batch of sampled segmentations holds
somewhat more tokens than train.max_tokens (BENCHMARKS.md measures how many), and an update's
loss is divided by its target tokens as prepared: a count every process knows without
exchanging one. A sampled side longer than data.max_len keeps its prepared segmentation.
"""

from __future__ import annotations

import sentencepiece as spm

from mtx.data import vocab
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

    def __getstate__(self) -> dict:
        return self.__dict__ | {"sp": None}

    def for_epoch(self, epoch: int) -> Resegment:
        other = Resegment(self.proto, self.alpha, self.seed, self.tagged, self.max_len)
        other.epoch, other.sp = epoch, self.sp
        return other

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
