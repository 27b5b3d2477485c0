import math

import pytest
import torch
from torch import nn

from mtx.config import ATTENTION_SCORES
from mtx.model.attention import MultiHeadAttention, attention
from mtx.model.cache import GrowingLayer
from mtx.model.rnn_attention import RecurrentAttention
from mtx.model.rows import linear


def causal_mask(length):
    """(T, T) bool, True where query i may attend key j, i.e. j <= i."""
    return torch.ones(length, length, dtype=torch.bool).tril()


def copied_pair(d=32, h=4, cross=False):
    torch.manual_seed(0)
    ours = MultiHeadAttention(d, h, cross=cross)
    ref = nn.MultiheadAttention(d, h, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.in_proj.weight)
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours.eval(), ref.eval()


def test_self_attention_with_padding_mask_equals_torch():
    ours, ref = copied_pair()
    x = torch.randn(3, 7, 32)
    lengths = torch.tensor([7, 4, 1])
    keep = torch.arange(7)[None, :] < lengths[:, None]  # (B, S)
    got = ours(x, mask=keep.unsqueeze(1))
    want, _ = ref(x, x, x, key_padding_mask=~keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_causal_self_attention_equals_torch():
    ours, ref = copied_pair()
    x = torch.randn(2, 6, 32)
    got = ours(x, causal=True)
    want, _ = ref(x, x, x, attn_mask=~causal_mask(6))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the explicit mask and the is_causal path agree too
    torch.testing.assert_close(ours(x, mask=causal_mask(6).expand(2, 6, 6)), got, atol=1e-6, rtol=0)


def test_cross_attention_equals_torch():
    ours, ref = copied_pair(cross=True)
    q, mem = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    keep = torch.tensor([[True] * 9, [True] * 3 + [False] * 6])
    got = ours(q, mem, mask=keep.unsqueeze(1))
    want, _ = ref(q, mem, mem, key_padding_mask=~keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_masked_keys_have_no_influence():
    ours, _ = copied_pair(cross=True)
    q, mem = torch.randn(1, 4, 32), torch.randn(1, 6, 32)
    keep = torch.tensor([[True, True, True, False, False, False]])
    a = ours(q, mem, mask=keep.unsqueeze(1))
    mem2 = mem.clone()
    mem2[:, 3:] = 100 * torch.randn(1, 3, 32)
    torch.testing.assert_close(ours(q, mem2, mask=keep.unsqueeze(1)), a)


@pytest.mark.parametrize("init, gain", [("xavier", 1.0), ("fairseq", 2**-0.5)])
def test_projections_start_as_separate_xavier_matrices(init, gain):
    """W^Q, W^K, W^V are stored as one matrix but each is initialised as a square Xavier one
    (fairseq's init: with gain 1/sqrt(2), and nn.Linear's biases); W^O is Xavier, bias 0."""
    torch.manual_seed(0)
    d = 256
    attn = MultiHeadAttention(d, 4, init=init)
    bound = gain * (6 / (2 * d)) ** 0.5
    for w in attn.in_proj.weight.chunk(3):
        assert w.abs().max() <= bound
        assert w.abs().max() > 0.95 * bound  # not the smaller bound of a (768, 256) matrix
    bias = attn.in_proj.bias.abs()
    if init == "xavier":
        assert not bias.any()
    else:
        assert bias.max() <= d**-0.5 and bias.max() > 0.95 * d**-0.5
    assert attn.out_proj.weight.abs().max() > 0.95 * (6 / (2 * d)) ** 0.5
    assert not attn.out_proj.bias.any()


def test_incremental_self_attention_cache_equals_causal():
    """Feeding positions one at a time through the cache equals causal attention at once."""
    ours, _ = copied_pair()
    x = torch.randn(2, 5, 32)
    cache = GrowingLayer()
    steps = [ours(x[:, t : t + 1], cache=cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), ours(x, causal=True), atol=1e-5, rtol=1e-5)
    assert cache.k.shape == (2, 4, 5, 8) and cache.length == 5


def test_training_kernels_and_written_out_inference_attention_agree():
    """Training runs torch's fused attention, inference `attention` written out: the same
    function (dropout off), with padding masks and causally."""
    ours, _ = copied_pair()
    x = torch.randn(3, 7, 32)
    keep = (torch.arange(7)[None, :] < torch.tensor([7, 4, 1])[:, None]).unsqueeze(1)
    for kwargs in ({"mask": keep}, {"causal": True}):
        ours.train()
        fused = ours(x, **kwargs)
        ours.eval()
        torch.testing.assert_close(ours(x, **kwargs), fused, atol=1e-6, rtol=1e-5)


def test_small_products_and_attention_give_each_row_the_numbers_of_a_large_batch():
    """What makes translations independent of the batch: row i of a product, and sentence i's
    attention, computed alone or among many, are equal bit for bit."""
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    x = torch.randn(200, 64)
    full = linear(x, weight, bias)
    torch.testing.assert_close(full, torch.nn.functional.linear(x, weight, bias))
    for rows in range(1, 20):
        assert torch.equal(linear(x[:rows], weight, bias), full[:rows]), rows
    q, k, v = torch.randn(200, 2, 1, 32), torch.randn(200, 2, 16, 32), torch.randn(200, 2, 16, 32)
    mask = torch.rand(200, 1, 1, 16) > 0.3
    mask[..., 0] = True
    full = attention(q, k, v, mask, causal=False)[0]
    for batch in (1, 2, 3, 7, 64):
        assert torch.equal(
            attention(q[:batch], k[:batch], v[:batch], mask[:batch], False)[0], full[:batch]
        )


def shaw_reference(mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Shaw et al. (2018) equations (3)-(5) with loops over sentences, heads and positions:
    e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z), z_i = sum_j alpha_ij (x_j W^V + a^V_ij),
    a_ij = w_clip(j - i, k); mask (B, T, T) True = attend."""
    B, T, d = x.shape
    H, dk, k = mha.n_heads, mha.d_k, mha.relative.max_distance
    wq, wk, wv = mha.in_proj.weight.split(d)
    bq, bk, bv = mha.in_proj.bias.split(d)
    out = torch.zeros(B, T, d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            cols = slice(h * dk, (h + 1) * dk)
            q = (x[b] @ wq.T + bq)[:, cols]
            key = (x[b] @ wk.T + bk)[:, cols]
            val = (x[b] @ wv.T + bv)[:, cols]
            for i in range(T):
                e = torch.full((T,), float("-inf"), dtype=torch.float64)
                for j in range(T):
                    if mask[b, i, j]:
                        r = max(-k, min(k, j - i)) + k
                        e[j] = q[i] @ (key[j] + mha.relative.keys[h, r]) / math.sqrt(dk)
                alpha = torch.softmax(e, 0)
                for j in range(T):
                    r = max(-k, min(k, j - i)) + k
                    out[b, i, cols] += alpha[j] * (val[j] + mha.relative.values[h, r])
    return out @ mha.out_proj.weight.T.double() + mha.out_proj.bias.double()


@pytest.mark.parametrize("k", [1, 2, 16])
@pytest.mark.parametrize("training", [False, True])
def test_relative_attention_equals_shaw_et_al_equations(k, training):
    torch.manual_seed(k)
    mha = MultiHeadAttention(16, 2, max_relative_position=k).double().train(training)
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    mask = torch.ones(3, 6, 6, dtype=torch.bool)
    mask[1, :, 4:] = False  # padding
    mask[2] = causal_mask(6)
    got = mha(x, mask=mask)
    torch.testing.assert_close(got, shaw_reference(mha, x, mask), atol=1e-10, rtol=1e-10)


def test_relative_attention_with_k_0_is_plain_attention_plus_a_constant_vector():
    """k = 0: one distance, so a^K adds the same q_i a^K to every score of query i (the softmax
    does not change) and a^V adds W^O concat_h(a^V_h) to every output."""
    torch.manual_seed(0)
    rel = MultiHeadAttention(32, 4, max_relative_position=0).eval()
    plain = MultiHeadAttention(32, 4).eval()
    plain.load_state_dict({n: p for n, p in rel.state_dict().items() if "relative" not in n})
    x = torch.randn(2, 7, 32)
    mask = (torch.rand(2, 1, 7) > 0.3) | (torch.arange(7) == 0)
    constant = rel.out_proj.weight @ rel.relative.values[:, 0].reshape(-1)
    diff = rel(x, mask=mask) - plain(x, mask=mask)
    torch.testing.assert_close(diff, constant.expand_as(diff), atol=1e-5, rtol=1e-5)
    assert constant.abs().max() > 0.1


def test_relative_self_attention_cache_equals_causal():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, max_relative_position=2).eval()
    x = torch.randn(2, 6, 32)
    cache = GrowingLayer()
    steps = [mha(x[:, t : t + 1], cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), mha(x, causal=True), atol=1e-5, rtol=1e-5)


def test_relative_distances_are_clipped():
    mha = MultiHeadAttention(8, 2, max_relative_position=2)
    got = mha.relative.index(3, 6, start=1, device=torch.device("cpu"))
    want = [[min(4, max(0, j - i + 2)) for j in range(6)] for i in range(1, 4)]
    assert got.tolist() == want


def recurrent_reference(att: RecurrentAttention, h: torch.Tensor, hs: torch.Tensor, length: int):
    """Bahdanau's and Luong's score functions for one decoder state h (d) over the first
    `length` encoder states hs (S, d), one source position at a time."""
    d, scores = h.size(0), []
    for s in range(length):
        if att.score == "dot":
            e = h @ hs[s]
        elif att.score == "scaled_dot":
            e = h @ hs[s] / d**0.5
        elif att.score == "general":
            e = h @ (att.key_proj.weight @ hs[s])
        elif att.score == "additive":
            hidden = att.query_proj.weight @ h + att.query_proj.bias + att.key_proj.weight @ hs[s]
            e = att.v @ torch.tanh(hidden)
        else:  # location: W_a h + b, row s
            e = att.location.weight[s] @ h + att.location.bias[s]
        scores.append(e)
    a = torch.softmax(torch.stack(scores), 0)
    return sum(a[s] * hs[s] for s in range(length)), a


@pytest.mark.parametrize("score", ATTENTION_SCORES)
def test_recurrent_attention_scores_equal_their_equations(score):
    torch.manual_seed(0)
    att = RecurrentAttention(score, 8, max_positions=12).double()
    for p in att.parameters():
        nn.init.normal_(p)
    B, G, S = 3, 2, 5  # two query rows (beams) per sentence
    query, memory = torch.randn(B * G, 8).double(), torch.randn(B, S, 8).double()
    lengths = [5, 3, 1]
    mask = (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).unsqueeze(1)
    context, weights = att(query, att.keys(memory), memory, mask)
    for row in range(B * G):
        b = row // G
        want_c, want_a = recurrent_reference(att, query[row], memory[b], lengths[b])
        torch.testing.assert_close(context[row], want_c, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(weights[row, : lengths[b]], want_a, rtol=1e-10, atol=1e-10)
        assert torch.all(weights[row, lengths[b] :] == 0)
