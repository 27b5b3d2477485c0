import numpy as np
import torch

from mtx.data.batching import collate, token_batches
from mtx.tokens import BOS_ID, PAD_ID


def test_batches_respect_the_token_budget_and_cover_every_sentence_once():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 1000), rng.integers(1, 60, 1000)
    batches = token_batches(src, tgt, max_tokens=300, seed=3, epoch=2)
    seen = np.sort(np.concatenate(batches))
    assert (seen == np.arange(1000)).all()
    for b in batches:
        assert len(b) * max(src[b].max(), tgt[b].max()) <= 300
    # grouped by length: little padding
    padded = sum(len(b) * src[b].max() for b in batches)
    assert src.sum() / padded > 0.9


def test_batch_order_is_deterministic_per_seed_and_epoch():
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(1, 30, 200), rng.integers(1, 30, 200)
    a = token_batches(src, tgt, 100, seed=1, epoch=0)
    b = token_batches(src, tgt, 100, seed=1, epoch=0)
    c = token_batches(src, tgt, 100, seed=1, epoch=1)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any(len(x) != len(y) or (x != y).any() for x, y in zip(a, c))


def test_a_sentence_over_the_budget_gets_a_batch_of_its_own():
    batches = token_batches(np.array([5, 500, 6]), np.array([5, 5, 6]), 100)
    assert sorted(len(b) for b in batches) == [1, 2]


def test_collate_shifts_targets_and_pads():
    batch = collate([[5, 6, 3], [7, 3]], [[8, 9, 3], [10, 3]])
    assert batch["src"].tolist() == [[5, 6, 3], [7, 3, PAD_ID]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 8, 9], [BOS_ID, 10, PAD_ID]]
    assert batch["tgt_out"].tolist() == [[8, 9, 3], [10, 3, PAD_ID]]
    assert batch["src"].dtype == torch.long
