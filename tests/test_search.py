import math

import torch
from conftest import tiny_model_config

from mtx.decode.search import beam_search, greedy_search, length_penalty, max_lengths
from mtx.model.transformer import BOS_ID, EOS_ID, PAD_ID, Transformer


def random_model(seed=0, vocab=24):
    torch.manual_seed(seed)
    model = Transformer(tiny_model_config(), vocab_size=vocab).eval()
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


def test_beam_one_equals_greedy():
    model, src = random_model(), random_src()
    greedy = greedy_search(model, src, 1.0, 6)
    beam = beam_search(model, src, beam=1, alpha=0.6, max_len_a=1.0, max_len_b=6)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        n = len(g.tokens) + 1
        assert math.isclose(g.score / length_penalty(n, 0.6), b[0].score, rel_tol=1e-5)


class MyopicModel:
    """Step 1: A 0.5, B 0.4, EOS 0.1. After A everything is uncertain (EOS 0.34); after B,
    EOS 0.95. Greedy picks A then EOS (p = 0.17); beam search finds B EOS (p = 0.38)."""

    vocab = 6
    A, B = 4, 5

    def encode(self, src):
        return torch.zeros(src.size(0), 1, 1), torch.ones(src.size(0), 1, 1, dtype=torch.bool)

    def new_cache(self):
        return [{}]

    def decode(self, tokens, memory, src_mask, cache):
        prefix = tokens if "prefix" not in cache[0] else torch.cat([cache[0]["prefix"], tokens], 1)
        cache[0]["prefix"] = prefix
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
    best = beam_search(model, src, beam=2, alpha=0.0)[0][0]
    assert greedy.tokens == [MyopicModel.A]
    assert best.tokens == [MyopicModel.B]
    assert best.score > greedy.score
    assert math.isclose(best.score, math.log(0.4) + math.log(0.95), rel_tol=1e-4)


def teacher_forced_logprob(model, src, tokens):
    memory, src_mask = model.encode(src)
    tgt = torch.tensor([[BOS_ID] + tokens])
    lprobs = torch.log_softmax(model.decode(tgt, memory, src_mask)[0].float(), -1)
    return sum(lprobs[i, t].item() for i, t in enumerate(tokens + [EOS_ID]))


def test_nbest_is_sorted_distinct_and_scores_are_the_models():
    model, src = random_model(), random_src(batch=3)
    nbest = beam_search(model, src, beam=5, alpha=0.6, max_len_b=8, nbest=5)
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


def test_output_does_not_depend_on_batching():
    model, src = random_model(), random_src(batch=6)
    together = beam_search(model, src, beam=4, max_len_b=8)
    for i in range(src.size(0)):
        one = src[i : i + 1, : int((src[i] != PAD_ID).sum())]
        alone = beam_search(model, one, beam=4, max_len_b=8)[0][0]
        assert alone.tokens == together[i][0].tokens
        assert math.isclose(alone.score, together[i][0].score, rel_tol=1e-4)


def test_every_hypothesis_ends_within_the_max_length():
    model, src = random_model(), random_src()
    limits = max_lengths(src, 1.0, 2, 1000).tolist()
    for hyps, limit in zip(beam_search(model, src, beam=3, max_len_b=2, nbest=3), limits):
        assert len(hyps) == 3
        assert all(len(h.tokens) + 1 <= limit for h in hyps)
    for h, limit in zip(greedy_search(model, src, 1.0, 2), limits):
        assert len(h.tokens) + 1 <= limit
