"""Each process's batches (train/data.py): one stream across epochs, in the same order for any
worker count, resumable at any batch."""

import itertools

import datasets
import torch
from conftest import TINY_RUN

from mtx.config import load_config
from mtx.train.data import stream, update_batches


def items(prepared, workers: int, epoch: int, batch: int, n: int, *extra) -> list:
    cfg = load_config(None, [*TINY_RUN, f"train.workers={workers}", *extra])
    ds = datasets.load_from_disk(str(prepared / "train"))
    loader = stream(ds, cfg.train, epoch, batch, 0, 1, torch.device("cpu"))
    return [
        (b.batch.src.tolist(), b.batch.tgt_out.tolist(), b.update_tokens, tuple(b.after))
        for b in itertools.islice(loader, n)
    ]


def test_the_stream_crosses_epochs_in_one_order_for_any_worker_count(prepared):
    cfg = load_config(None, [*TINY_RUN, "train.update_freq=2"])
    ds = datasets.load_from_disk(str(prepared / "train"))
    per_epoch = len(update_batches(ds, cfg.train, 0, 0, 0, 1)[0])
    n = per_epoch + 6  # into the second epoch
    one = items(prepared, 0, 0, 0, n, "train.update_freq=2")
    assert items(prepared, 2, 0, 0, n, "train.update_freq=2") == one
    assert [after for *_, after in one[per_epoch - 2 : per_epoch + 2 : 2]] == [
        (0, per_epoch),
        (1, 2),
    ]  # positions: an update is 2 batches; the second epoch starts again at 0
    # started where the run stood after update u, the stream goes on as it did
    epoch, batch = one[9][3]
    assert items(prepared, 1, epoch, batch, n - 10, "train.update_freq=2") == one[10:]
    assert one[:6] != one[per_epoch:]  # epoch 1 in another order
