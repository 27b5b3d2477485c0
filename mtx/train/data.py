"""What each process trains on: its share of every update's batches, built in the background.

An epoch's batches (data/batching.py, ordered by (seed, epoch)) are taken in groups of
world x train.update_freq, one group an update, process r taking the r-th update_freq of them;
a last group too small for an update is left out. So N processes train exactly as one process
with N times the update_freq, and a run resumes at any batch of any epoch.

`stream` is one loader for the whole run: its workers go from one epoch to the next without
stopping, where a loader per epoch started its workers again and drained its queue at every
epoch's end (on Multi30k's short epochs, a log window in ten ran measurably slower:
BENCHMARKS.md). Each batch comes with its update's
target tokens and where the run stands once its update is done (`Streamed`), so the trainer's
position follows the data.

With several corpora (`Mix`), an epoch is the rows mtx/corpora.py draws for it, by
(seed, epoch) alone, batched as one corpus's rows are. With data.bpe_dropout, the workers
segment each pair anew (data/bpe_dropout.py), by (seed, epoch, row) alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from mtx import corpora
from mtx.checkpoint import Manifest
from mtx.config import Config, DataConfig, TrainConfig
from mtx.data.batching import Batch, BatchDataset, fixed_batches, lengths, token_batches
from mtx.data.bpe_dropout import Resegment
from mtx.errors import MtxError
from mtx.tokens import BOS_ID
from mtx.train.faults import ignore_stop_signals


@dataclass(frozen=True)
class Mix:
    """Several corpora in the training data: each row's corpus (the prepared `group`
    column) and each corpus's share of an epoch (mtx/corpora.py)."""

    corpus: np.ndarray
    shares: np.ndarray

    @classmethod
    def of(cls, ds, d: DataConfig) -> Mix | None:
        """The mix of a prepared training split, or None for one corpus (every row, once,
        each epoch)."""
        cs = corpora.corpora(d)
        if len(cs) == 1:
            return None
        corpus = np.asarray(ds["group"], dtype=np.int64)
        sizes = np.bincount(corpus, minlength=len(cs))
        return cls(corpus, corpora.shares(sizes, [c.weight for c in cs], d.corpus_temperature))


def sampled(cfg: Config, spm_proto: bytes, tagged: bool, ds) -> tuple[Resegment, TrainConfig]:
    """data.bpe_dropout's segmenter (`tagged`: the prepared sources start with a target-language
    tag, which sampling keeps), and the batching settings it needs: train.max_tokens divided
    by how much longer sampled segmentations are on this data (data/bpe_dropout.py)."""
    d, t = cfg.data, cfg.train
    resegment = Resegment(spm_proto, d.bpe_dropout, t.seed, tagged, d.max_len)
    padded, resegment.tgt_ratio = resegment.growth(ds, t.max_tokens, t.pad_to)
    budget = max(int(t.max_tokens / max(padded, 1.0)), d.max_len + 1)
    return resegment, dataclasses.replace(t, max_tokens=budget)


def update_batches(
    ds, t: TrainConfig, epoch: int, first: int, rank: int, world: int, mix: Mix | None = None
) -> tuple[list[np.ndarray], list[int]]:
    """This process's batches (row indices) of epoch `epoch` from batch `first` on, and the
    target tokens of each update (all processes together)."""
    U, G = t.update_freq, world * t.update_freq
    src_lens, tgt_lens = lengths(ds)
    order = epoch_batches(src_lens, tgt_lens, t, epoch, mix)
    usable = len(order) - len(order) % G
    if usable == 0:
        raise MtxError(
            f"the training data makes {len(order)} batches of train.max_tokens "
            f"({t.max_tokens}) tokens, fewer than one update takes ({G}: {world} process(es) "
            f"x train.update_freq {U}); lower train.update_freq or train.max_tokens"
        )
    mine, update_tokens = [], []
    for g in range(first, usable, G):
        mine += order[g + rank * U : g + (rank + 1) * U]
        update_tokens.append(int(sum(tgt_lens[b].sum() for b in order[g : g + G])))
    return mine, update_tokens


def epoch_batches(
    src_lens, tgt_lens, t: TrainConfig, epoch: int, mix: Mix | None = None
) -> list[np.ndarray]:
    """Epoch `epoch`'s batches (row indices), of bounded or, with train.static_shapes, fixed
    shapes (data/batching.py), over the rows the corpora's mix draws for the epoch."""
    make = fixed_batches if t.static_shapes else token_batches
    if mix is None:
        return make(src_lens, tgt_lens, t.max_tokens, t.seed, epoch, t.pad_to)
    rows = corpora.epoch_rows(mix.corpus, mix.shares, t.seed, epoch)
    batches = make(src_lens[rows], tgt_lens[rows], t.max_tokens, t.seed, epoch, t.pad_to)
    return [rows[b] for b in batches]


@dataclass
class Streamed:
    """A batch of the stream, with what the trainer needs to know of its update."""

    batch: Batch
    update_tokens: int  # the target tokens of its update, all processes together
    after: tuple[int, int]  # (epoch, batch): where the run stands once its update is done

    def pin_memory(self) -> Streamed:
        return dataclasses.replace(self, batch=self.batch.pin_memory())


def fixed_tokens(t: TrainConfig) -> int:
    """What `collate` takes as fixed_tokens: train.max_tokens with static shapes, else 0."""
    return t.max_tokens if t.static_shapes else 0


class Stream(torch.utils.data.IterableDataset):
    """This process's padded batches from batch `batch` of epoch `epoch` on, epoch after epoch
    without end, each `Streamed` with its update's target tokens and where the run stands
    once its update is done. With several workers,
    worker w builds batches w, w + W, ... and the loader takes them in turn: the same order
    as one worker's."""

    def __init__(
        self, ds, t: TrainConfig, epoch: int, batch: int, rank: int, world: int, mix=None,
        resegment=None, decoder_start: int = BOS_ID, links=None,
    ) -> None:  # fmt: skip
        self.ds, self.t, self.start, self.mix, self.links = ds, t, (epoch, batch), mix, links
        self.rank, self.world, self.resegment = rank, world, resegment
        self.decoder_start = decoder_start  # the decoder's first input (model.decoder_start)

    def tokens(self, prepared: int) -> int:
        """An update's target tokens: as prepared, or with data.bpe_dropout as many times the
        sampled ratio (see `sampled`)."""
        if self.resegment is None:
            return prepared
        return max(1, round(prepared * self.resegment.tgt_ratio))

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, W = (info.id, info.num_workers) if info else (0, 1)
        t, (epoch, first), i = self.t, self.start, 0
        G = self.world * t.update_freq
        while True:
            mine, tokens = update_batches(self.ds, t, epoch, first, self.rank, self.world, self.mix)
            sampled = self.resegment.for_epoch(epoch) if self.resegment else None
            items = BatchDataset(
                self.ds, mine, t.pad_to, fixed_tokens(t), sampled, self.decoder_start, self.links
            )
            for k in range(len(mine)):
                if i % W == w:
                    update = k // t.update_freq
                    after = (epoch, first + (update + 1) * G)
                    yield Streamed(items[k], self.tokens(tokens[update]), after)
                i += 1
            epoch, first = epoch + 1, 0


def stream(
    ds, t: TrainConfig, epoch: int, batch: int, rank: int, world: int, device, mix=None,
    resegment=None, decoder_start: int = BOS_ID, links=None,
):  # fmt: skip
    """`Stream`'s batches, built by train.workers background processes for the whole run
    (`links`: the piece links of guided alignment). Data too small for one update is refused
    here, in one line, before any worker starts."""
    update_batches(ds, t, epoch, 0, rank, world, mix)
    return torch.utils.data.DataLoader(
        Stream(ds, t, epoch, batch, rank, world, mix, resegment, decoder_start, links),
        batch_size=None,
        num_workers=t.workers,
        prefetch_factor=4 if t.workers else None,
        pin_memory=device.type == "cuda",
        generator=torch.Generator(),  # keeps the global RNG (dropout) untouched by loaders
        worker_init_fn=ignore_stop_signals,
    )


def fingerprint(manifest: Manifest, spm_proto: bytes, links=None) -> dict[str, str]:
    """What must be the same on every process: the training and validation pairs' hashes from
    the manifest, the hash of spm.model as read, and with guided alignment the hash of the
    piece links (data/aligned.py's PieceLinks)."""
    pairs = {name: split.pairs_sha256 for name, split in manifest.splits.items()}
    out = {
        "spm.model sha256": hashlib.sha256(spm_proto).hexdigest(),
        "train pairs sha256": str(pairs.get("train")),
        "valid pairs sha256": str(pairs.get("valid")),
    }
    if links is not None:
        out["alignments sha256"] = links.sha256()
    return out
