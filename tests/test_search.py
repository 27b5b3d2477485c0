import math

import pytest
import torch
from conftest import tiny_model_config

from mtx.decode import search
from mtx.decode.rules import SearchSettings, length_penalty, max_lengths, source_lengths
from mtx.decode.search import Sampling, beam_search, greedy_search
from mtx.model.build import make_model
from mtx.model.interface import Capabilities
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, SPECIALS

ARCHS = {  # the models every search is tested with
    "transformer": {},
    "rnn-lstm-additive": {"arch": "rnn", "rnn_cell": "lstm", "attention": "additive"},
    "rnn-gru-location": {"arch": "rnn", "rnn_cell": "gru", "attention": "location"},
}


def random_model(seed=0, vocab=24, arch="transformer"):
    torch.manual_seed(seed)
    model = make_model(tiny_model_config(**ARCHS[arch]), vocab_size=vocab).eval()
    with torch.no_grad():  # sharpen the output so hypotheses end at various lengths
        model.embed.weight.mul_(3.0)
    return model


def random_src(batch=5, seed=1, vocab=24):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, 9), generator=g)
    lengths = torch.randint(2, 9, (batch,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        src[i, n] = EOS_ID
        src[i, n + 1 :] = PAD_ID
    return src


def test_length_penalty_formula():
    assert length_penalty(7, 0.6) == ((5 + 7) / 6) ** 0.6
    assert length_penalty(7, 0.0) == 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_one_equals_greedy(arch):
    model, src = random_model(arch=arch), random_src()
    greedy = greedy_search(model, src, SearchSettings(max_len_b=6))
    beam = beam_search(model, src, SearchSettings(beam=1, max_len_b=6))
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        n = len(g.tokens) + 1
        assert math.isclose(g.score / length_penalty(n, 0.6), b[0].score, rel_tol=1e-5)


class PrefixCache:
    """A test model's cache: each hypothesis's tokens so far (reordered with the beams) and
    the memory (one row per sentence), as model/cache.py's caches keep theirs."""

    def __init__(self):
        self.prefix, self.memory = None, None

    def extend(self, tokens):
        self.prefix = tokens if self.prefix is None else torch.cat([self.prefix, tokens], 1)
        return self.prefix

    def reorder(self, rows):
        self.prefix = self.prefix.index_select(0, rows)

    def select(self, sentences):
        self.memory = self.memory.index_select(0, sentences)


class MyopicModel:
    """Step 1: A 0.5, B 0.4, EOS 0.1. After A everything is uncertain (EOS 0.34); after B,
    EOS 0.95. Greedy picks A then EOS (p = 0.17); beam search finds B EOS (p = 0.38)."""

    capabilities = Capabilities()  # logits, a growing cache
    specials = SPECIALS["bos"]
    vocab = 6
    A, B = 4, 5

    def encode(self, src, padded=True):
        return torch.zeros(src.size(0), 1, 1), torch.ones(src.size(0), 1, 1, dtype=torch.bool)

    def new_cache(self):
        return PrefixCache()

    def decode(self, tokens, memory, src_mask, cache):
        if cache.memory is None:
            cache.memory = memory
        prefix = cache.extend(tokens)
        probs = torch.full((prefix.size(0), self.vocab), 1e-6)
        for i, row in enumerate(prefix.tolist()):
            last = row[-1]
            if last == BOS_ID:
                probs[i, [self.A, self.B, EOS_ID]] = torch.tensor([0.5, 0.4, 0.1])
            elif last == self.A:
                probs[i, [self.A, self.B, EOS_ID]] = torch.tensor([0.33, 0.33, 0.34])
            else:
                probs[i, [self.A, self.B, EOS_ID]] = torch.tensor([0.025, 0.025, 0.95])
        return probs.log().unsqueeze(1)


def test_beam_search_finds_what_greedy_misses():
    model, src = MyopicModel(), torch.tensor([[7, EOS_ID]])
    greedy = greedy_search(model, src)[0]
    best = beam_search(model, src, SearchSettings(beam=2, alpha=0.0))[0][0]
    assert greedy.tokens == [MyopicModel.A]
    assert best.tokens == [MyopicModel.B]
    assert best.score > greedy.score
    assert math.isclose(best.score, math.log(0.4) + math.log(0.95), rel_tol=1e-4)


def teacher_forced_logprob(model, src, tokens):
    memory, src_mask = model.encode(src)
    tgt = torch.tensor([[BOS_ID] + tokens])
    lprobs = torch.log_softmax(model.decode(tgt, memory, src_mask)[0].float(), -1)
    return sum(lprobs[i, t].item() for i, t in enumerate(tokens + [EOS_ID]))


@pytest.mark.parametrize("arch", ARCHS)
def test_nbest_is_sorted_distinct_and_scores_are_the_models(arch):
    model, src = random_model(arch=arch), random_src(batch=3)
    nbest = beam_search(model, src, SearchSettings(beam=5, max_len_b=8), nbest=5)
    for i, hyps in enumerate(nbest):
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
        one = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        for h in hyps:
            want = teacher_forced_logprob(model, one, h.tokens) / length_penalty(
                len(h.tokens) + 1, 0.6
            )
            assert math.isclose(h.score, want, rel_tol=1e-4, abs_tol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_output_does_not_depend_on_batching(arch):
    model, src = random_model(arch=arch), random_src(batch=6)
    together = beam_search(model, src, SearchSettings(max_len_b=8))
    for i in range(src.size(0)):
        one = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        alone = beam_search(model, one, SearchSettings(max_len_b=8))[0][0]
        assert alone.tokens == together[i][0].tokens
        assert math.isclose(alone.score, together[i][0].score, rel_tol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_hypothesis_ends_within_the_max_length(arch):
    model, src = random_model(arch=arch), random_src()
    limits = max_lengths(source_lengths(src), 1.0, 2, 1000).tolist()
    for hyps, limit in zip(
        beam_search(model, src, SearchSettings(beam=3, max_len_b=2), nbest=3), limits
    ):
        assert len(hyps) == 3
        assert all(len(h.tokens) + 1 <= limit for h in hyps)
    for h, limit in zip(greedy_search(model, src, SearchSettings(max_len_b=2)), limits):
        assert len(h.tokens) + 1 <= limit


class Uncached:
    """`model` decoding without a key/value cache: every step recomputes the whole prefix."""

    capabilities = Capabilities()

    def __init__(self, model):
        self.model, self.specials = model, model.specials

    def encode(self, src, padded=True):
        return self.model.encode(src, padded)

    def new_cache(self):
        return PrefixCache()

    def decode(self, last, memory, src_mask, cache):
        if cache.memory is None:  # one row per sentence, like the model's own
            cache.memory = memory
        prefix = cache.extend(last)
        group = last.size(0) // cache.memory.size(0)
        memory = cache.memory.repeat_interleave(group, 0)
        mask = None if src_mask is None else src_mask.repeat_interleave(group, 0)
        return self.model.decode(prefix, memory, mask)[:, -1:]


def same_hypotheses(a, b):
    assert [h.tokens for h in a] == [h.tokens for h in b]
    for x, y in zip(a, b):
        assert math.isclose(x.score, y.score, abs_tol=1e-4)
        assert math.isclose(x.log_prob, y.log_prob, abs_tol=1e-4)


@pytest.mark.parametrize("starts", [1, 3])
def test_next_log_probs_are_the_log_softmax_of_the_models_logits(starts):
    """On the CPU the log-softmax is written over the model's logits (no fresh (N, V) tensor
    a step): the same numbers as a log-softmax beside them, after one start token or after
    several (where the last position's logits are a strided view of the decoder's output)."""
    model, src = random_model(), random_src(batch=4)
    memory, mask = model.encode(src)
    last = torch.full((4, starts), BOS_ID)
    last[:, 1:] = 5
    logits = model.decode(last, memory, mask, model.new_cache())[:, -1]
    expected = torch.log_softmax(logits, dim=-1)
    expected[:, : model.specials.never_below] = -torch.inf
    got = search.next_log_probs(model, last, memory, mask, model.new_cache(), [False] * 4)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_equals_recomputing_the_prefix(arch):
    model, src = random_model(arch=arch), random_src(batch=6)
    slow = Uncached(model)
    for stopping in ("k_finished", "exact"):
        cached = beam_search(
            model, src, SearchSettings(beam=3, max_len_b=8, stopping=stopping), nbest=3
        )
        uncached = beam_search(
            slow, src, SearchSettings(beam=3, max_len_b=8, stopping=stopping), nbest=3
        )
        for a, b in zip(cached, uncached):
            same_hypotheses(a, b)
    same_hypotheses(
        greedy_search(model, src, SearchSettings(max_len_b=8)),
        greedy_search(slow, src, SearchSettings(max_len_b=8)),
    )
    sampling, seeds = Sampling(temperature=1.5, top_k=10), [[0, i] for i in range(6)]
    same_hypotheses(
        greedy_search(model, src, SearchSettings(max_len_b=8), sampling=sampling, seeds=seeds),
        greedy_search(slow, src, SearchSettings(max_len_b=8), sampling=sampling, seeds=seeds),
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_cross_attention_shares_one_memory_row_among_a_sentences_beams(arch):
    model, src = random_model(arch=arch), random_src(batch=3)
    memory, src_mask = model.encode(src)
    tgt = torch.randint(4, 24, (3 * 4, 5))
    shared = model.decode(tgt, memory, src_mask, model.new_cache())
    repeated = model.decode(
        tgt, memory.repeat_interleave(4, 0), src_mask.repeat_interleave(4, 0), model.new_cache()
    )
    torch.testing.assert_close(shared, repeated, atol=1e-5, rtol=1e-5)
    cache = model.new_cache()
    model.decode(tgt[:, :1], memory, src_mask, cache)
    if arch == "transformer":
        memory_rows, beam_rows = cache.layers[0].memory_k, cache.layers[0].k
    else:
        memory_rows, beam_rows = cache.keys, cache.hs[0]
    assert memory_rows.size(0) == 3 and beam_rows.size(0) == 12


def test_exact_stopping_finds_what_running_to_the_maximum_length_finds():
    better = 0
    for seed in range(3):
        model, src = random_model(seed=3 + seed), random_src(batch=8, seed=4 + seed)
        for alpha in (0.0, 0.6, 1.5):
            first_k = beam_search(
                model, src, SearchSettings(beam=3, alpha=alpha, max_len_b=10), nbest=2
            )
            exact = beam_search(
                model,
                src,
                SearchSettings(beam=3, alpha=alpha, max_len_b=10, stopping="exact"),
                nbest=2,
            )
            never = beam_search(
                model,
                src,
                SearchSettings(beam=3, alpha=alpha, max_len_b=10, stopping="never"),
                nbest=2,
            )
            for f, e, n in zip(first_k, exact, never):
                same_hypotheses(e, n)
                assert e[0].score >= f[0].score - 1e-4 and e[1].score >= f[1].score - 1e-4
                better += e[0].score > f[0].score + 1e-4
    assert better > 0  # stopping at K finished hypotheses does miss better ones


def test_bpe_dropout_is_seeded_per_sentence_and_keeps_to_top_k():
    model, src = random_model(), random_src(batch=6)
    sampling = Sampling(temperature=2.0, top_k=3)
    seeds = [[7, i] for i in range(6)]
    together = greedy_search(
        model, src, SearchSettings(max_len_b=8), sampling=sampling, seeds=seeds
    )
    for i in range(6):
        one = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        alone = greedy_search(
            model,
            one,
            SearchSettings(max_len_b=8),
            sampling=sampling,
            seeds=[seeds[i]],
        )
        same_hypotheses(alone, together[i : i + 1])
    other = greedy_search(
        model,
        src,
        SearchSettings(max_len_b=8),
        sampling=sampling,
        seeds=[[8, i] for i in range(6)],
    )
    assert [h.tokens for h in other] != [h.tokens for h in together]
    # log_prob is the model's own (untempered) log-probability of the sample
    for i, h in enumerate(together):
        one = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        assert math.isclose(h.log_prob, teacher_forced_logprob(model, one, h.tokens), abs_tol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_copies_branch_from_one_row_and_ended_rows_leave_without_changing_a_token(
    arch, monkeypatch
):
    """Samples drawn as copies of a sentence (decoded as one row, then as its copies) are
    those of the sentence repeated; how long ended rows stay in the batch (search.COMPACT)
    changes no output of greedy search or sampling."""
    model, src = random_model(arch=arch), random_src(batch=6)
    sampling, seeds = Sampling(temperature=1.5), [[3, i, j] for i in range(6) for j in range(3)]
    repeated = greedy_search(
        model,
        src.repeat_interleave(3, 0),
        SearchSettings(max_len_b=8, limit=1024),
        sampling=sampling,
        seeds=seeds,
    )
    runs = []
    for compact in (1, 2, 10**6):  # never before the end, at half, at once
        monkeypatch.setattr(search, "COMPACT", compact)
        copied = greedy_search(
            model,
            src,
            SearchSettings(max_len_b=8, limit=1024),
            sampling=sampling,
            seeds=seeds,
            copies=3,
        )
        assert [(h.tokens, h.score) for h in copied] == [(h.tokens, h.score) for h in repeated]
        runs.append(
            [(h.tokens, h.score) for h in greedy_search(model, src, SearchSettings(max_len_b=8))]
        )
    assert runs[0] == runs[1] == runs[2]
    assert len({len(h[0]) for h in runs[0]}) > 2  # rows ended at different steps
    with pytest.raises(ValueError, match="need a pick"):
        greedy_search(model, src, SearchSettings(max_len_b=8), copies=2)


def test_top_k_and_top_p_keep_only_the_most_probable_tokens():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]])
    lprobs = probs.log()
    u = torch.linspace(0, 0.999, 200)
    for sampling, allowed in (
        (Sampling(top_k=2), [{0, 1}, {2, 3}]),
        (Sampling(top_p=0.7), [{0, 1}, {2, 3}]),  # 0.5 < 0.7 <= 0.5 + 0.3
        (Sampling(top_p=0.5), [{0}, {3}]),
        (Sampling(top_k=3, top_p=0.99), [{0, 1, 2}, {1, 2, 3}]),
        (Sampling(), [{0, 1, 2, 3}, {0, 1, 2, 3}]),
    ):
        for row in range(2):
            picked = sampling.pick(lprobs[row].expand(200, 4), u)
            assert set(picked.tolist()) == allowed[row], (sampling, row)
    # the draw inverts the (renormalized) distribution: u below 0.5 / 0.8 picks token 0
    picked = Sampling(top_k=2).pick(lprobs[:1].expand(200, 4), u)
    assert (picked == 0).float().mean().item() == pytest.approx(0.5 / 0.8, abs=0.01)
