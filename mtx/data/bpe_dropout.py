"""Subword regularisation on the fly: BPE-dropout (Provilkov et al. 2020), a new segmentation
of every training pair in every epoch (data.bpe_dropout).

BPE-dropout, as its paper states it: a word is segmented from its characters by BPE's merges,
the merge of the highest score among adjacent pairs first, except that at each step each
possible merge is left out with probability alpha. The merges are the SentencePiece model's
own: its pieces and their scores, over the word boundaries of the prepared segmentation
(with alpha 0 the segmentation is SentencePiece's, tested on every test sentence).
SentencePiece has BPE-dropout too (`enable_sampling`), but its segmentations are not a
function of its seed alone: the same seed gives other segmentations in another process,
which would make the processes of a torchrun job, and a resumed run, train on other data.

The segmentation of pair i (its row in the prepared data) in epoch e is a function of
(train.seed, e, i) alone: each side draws from its own generator, seeded by a hash of the
three. So it is the same on every process, after a resume and for any number of loader
workers, and two epochs segment a pair differently. Validation, test and translation read
the prepared segmentation and never sample.

Sampled segmentations are longer than the prepared ones (BENCHMARKS.md has how much longer), and batches are formed from the prepared lengths. So `growth` measures, once
at the start and the same on every process, how much sampling grows batches of the run's own
data (the first 2,000 pairs, epoch 0): the trainer forms batches with train.max_tokens divided
by the padded growth, so that a sampled batch's padded size is about train.max_tokens, and
divides an update's loss by its prepared target tokens times the target tokens' growth (a
count every process knows without exchanging one; within a few percent of the sampled
count). A sampled side longer than data.max_len keeps its prepared segmentation.
"""

from __future__ import annotations

import copy
import random

from mtx.data import vocab
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.errors import MtxError
from mtx.tokens import EOS_ID

MASK = (1 << 32) - 1
WORD = "\u2581"  # SentencePiece's word boundary: a piece starting with it starts a word


def pair_seed(seed: int, epoch: int, row: int) -> int:
    """A 32-bit seed from (seed, epoch, row) (splitmix64's finaliser over the three folded
    together)."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + row) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (x ^ (x >> 31)) & MASK


class Merges:
    """A SentencePiece BPE model's merges: every normal piece's score, by piece."""

    def __init__(self, spm_proto: bytes) -> None:
        v = vocab.load(spm_proto)
        if not isinstance(v, vocab.Joint):
            raise MtxError(
                "data.bpe_dropout samples the segmentations of mtx's own SentencePiece BPE "
                "model; an imported model's vocabulary is not one: set data.bpe_dropout=0"
            )
        self.sp = sp = v.sp
        self.score, self.id = {}, {}
        for i in range(sp.get_piece_size()):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i):
                continue
            piece = sp.id_to_piece(i)
            self.score[piece], self.id[piece] = sp.get_score(i), i

    def word(self, symbols: list[str], alpha: float, draw) -> list[str]:
        """One word's pieces from its characters: the best-scoring merge of two adjacent
        pieces first, each possible merge left out with probability alpha at each step."""
        score = self.score
        while True:
            best, best_score = -1, 0.0
            for i in range(len(symbols) - 1):
                s = score.get(symbols[i] + symbols[i + 1])
                if s is None or (alpha and draw() < alpha):
                    continue
                if best < 0 or s > best_score:
                    best, best_score = i, s
            if best < 0:
                return symbols
            symbols[best : best + 2] = [symbols[best] + symbols[best + 1]]

    def sample(self, ids: list[int], alpha: float, seed: int) -> list[int]:
        """A sampled segmentation of the text that prepared `ids` (no tag, no EOS) segment: each
        word anew from its characters; a word with a character the model lacks stays as it
        is."""
        draw = random.Random(seed).random
        out: list[int] = []
        pieces = [self.sp.id_to_piece(i) for i in ids]
        start = 0
        for end in range(1, len(pieces) + 1):
            if end < len(pieces) and not pieces[end].startswith(WORD):
                continue
            chars = list("".join(pieces[start:end]))
            if all(c in self.id for c in chars):
                out += [self.id[p] for p in self.word(chars, alpha, draw)]
            else:
                out += ids[start:end]
            start = end
        return out


class Resegment:
    """Sampled segmentations of training pairs: `for_epoch(e)(rows, batch)` gives the batch's
    src_ids and tgt_ids. Pickles as the model proto: each loader worker loads its own."""

    def __init__(
        self, spm_proto: bytes, alpha: float, seed: int, tagged: bool, max_len: int
    ) -> None:
        self.proto, self.alpha, self.seed = spm_proto, alpha, seed
        self.tagged, self.max_len = tagged, max_len
        self.epoch, self.merges = 0, None
        self.tgt_ratio = 1.0  # target tokens sampled per prepared token, once measured (growth)

    def __getstate__(self) -> dict:
        return self.__dict__ | {"merges": None}

    def for_epoch(self, epoch: int) -> Resegment:
        if self.merges is None:  # loaded once per process, shared by every epoch's copy
            self.merges = Merges(self.proto)
        other = copy.copy(self)  # which, through __getstate__, leaves merges out
        other.epoch, other.merges = epoch, self.merges
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
                total[0] += b.src.numel()
                total[1] += b.tgt_out.numel()
                total[2] += b.tgt_tokens
        return max(after[0] / before[0], after[1] / before[1]), after[2] / before[2]

    def __call__(self, rows: list[int], batch: dict[str, list]) -> tuple[list, list]:
        """The batch's (src_ids, tgt_ids): each side sampled, with EOS (and the source's tag)."""
        sample, a = self.merges.sample, self.alpha
        src_out, tgt_out = [], []
        for k, row in enumerate(rows):
            src, tgt = batch["src_ids"][k], batch["tgt_ids"][k]
            tag = src[:1] if self.tagged else []
            seed = pair_seed(self.seed, self.epoch, 2 * row)
            new_src = tag + sample(src[len(tag) : -1], a, seed) + [EOS_ID]
            new_tgt = sample(tgt[:-1], a, pair_seed(self.seed, self.epoch, 2 * row + 1)) + [EOS_ID]
            src_out.append(new_src if len(new_src) - 1 <= self.max_len else src)
            tgt_out.append(new_tgt if len(new_tgt) - 1 <= self.max_len else tgt)
        return src_out, tgt_out
