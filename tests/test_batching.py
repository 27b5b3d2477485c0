import numpy as np
import torch

from mtx.data.batching import bucket_length, collate, fixed_batches, fixed_rows, token_batches
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID


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
    assert batch.src.tolist() == [[5, 6, 3], [7, 3, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9], [BOS_ID, 10, PAD_ID]]
    assert batch.tgt_out.tolist() == [[8, 9, 3], [10, 3, PAD_ID]]
    assert batch.src.dtype == torch.long


def test_bucket_lengths_come_from_a_small_set_and_pad_little():
    n = np.arange(1, 1025)
    padded = bucket_length(n, 8)
    assert (padded >= n).all() and (np.diff(padded) >= 0).all()
    assert (padded[:16] == n[:16]).all()  # short sentences keep their length
    assert ((padded - n) <= n / 8).all() and (padded - n).max() == 7  # at most 1/8, at most 7
    assert len(set(padded[:256].tolist())) == 56  # lengths up to 256: 56 shapes a side
    assert (padded[padded >= 64] % 8 == 0).all()
    assert (bucket_length(n, 1) == n).all() and bucket_length(37, 4) == 40
    assert bucket_length(37, 8) == 40 and isinstance(bucket_length(37, 8), int)


def test_bounded_batches_keep_the_budget_and_the_host_counts():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 120, 3000), rng.integers(1, 120, 3000)
    shapes = set()
    for b in token_batches(src, tgt, max_tokens=2000, seed=1, pad_to=8):
        S, T = bucket_length(src[b].max(), 8), bucket_length(tgt[b].max(), 8)
        assert len(b) == 1 or len(b) * max(S, T) <= 2000
        shapes.add((S, T))
    exact = {(src[b].max(), tgt[b].max()) for b in token_batches(src, tgt, 2000, seed=1)}
    allowed = set(bucket_length(np.arange(1, 121), 8).tolist())
    assert {x for shape in shapes for x in shape} <= allowed
    assert len(shapes) < 0.6 * len(exact)
    batch = collate([[5] * 16 + [3], [7, 3]], [[8] * 20 + [3], [10, 3]], pad_to=8)
    assert batch.src.shape == (2, 18) and batch.tgt_in.shape == batch.tgt_out.shape == (
        2,
        22,
    )
    assert (batch.src_tokens, batch.tgt_tokens, batch.src_padded) == (19, 23, True)
    assert batch.tgt_tokens == len(batch.tgt_index)
    unpadded = collate([[5, 3], [7, 3]], [[8, 3], [10, 9, 3]], pad_to=8)
    assert unpadded.src_padded is False and unpadded.tgt_tokens == 5


def test_fixed_batches_take_one_shape_per_length_in_every_epoch():
    """train.static_shapes: every pair once an epoch; each batch (rows(L), L) a side once
    collated, within the budget; the set of shapes is the corpus's lengths, the same every
    epoch, while the batches themselves change."""
    rng = np.random.default_rng(0)
    src = rng.integers(1, 90, 3000)
    tgt = np.clip(src + rng.integers(-5, 6, 3000), 1, 100)
    lengths = set(np.asarray(bucket_length(np.maximum(src, tgt), 8)).tolist())
    epochs = [fixed_batches(src, tgt, 1000, seed=3, epoch=e, pad_to=8) for e in range(3)]
    for batches in epochs:
        assert sorted(np.concatenate(batches).tolist()) == list(range(3000))
        shapes = set()
        for b in batches:
            L = bucket_length(int(max(src[b].max(), tgt[b].max())), 8)
            assert len(b) <= fixed_rows(L, 1000) and fixed_rows(L, 1000) * L <= 1000
            pairs = [[5] * (int(n) - 1) + [EOS_ID] for n in src[b]]
            targets = [[6] * (int(n) - 1) + [EOS_ID] for n in tgt[b]]
            batch = collate(pairs, targets, 8, fixed_tokens=1000)
            shape = (batch.src.shape, batch.tgt_in.shape, batch.tgt_index.shape)
            assert shape == (
                (fixed_rows(L, 1000), L),
                (fixed_rows(L, 1000), L),
                (fixed_rows(L, 1000) * L,),
            )
            assert batch.tgt_tokens == int(tgt[b].sum()) and batch.src_padded
            shapes.add(shape)
        assert len(shapes) == len(lengths)
    assert [len(e) for e in epochs[1:]] == [len(epochs[0])] * 2
    assert any(not np.array_equal(a, b) for a, b in zip(epochs[0], epochs[1]))


def test_fixed_collate_fills_with_empty_pairs_that_hold_no_target():
    batch = collate([[7, 8, EOS_ID]], [[9, EOS_ID]], 1, fixed_tokens=12)
    assert (
        batch.src.tolist()
        == [[7, 8, EOS_ID], [EOS_ID, PAD_ID, PAD_ID]] + [[EOS_ID, PAD_ID, PAD_ID]] * 2
    )
    assert batch.tgt_in[1:].tolist() == [[BOS_ID, PAD_ID, PAD_ID]] * 3
    assert (batch.tgt_out[1:] == PAD_ID).all()
    assert batch.tgt_tokens == 2 and batch.src_tokens == 3
