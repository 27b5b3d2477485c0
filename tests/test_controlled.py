"""The controlled search (mtx/decode/controlled.py): target prefixes, hard constraints by
dynamic beam allocation, avoided phrases; their rules (rules.py) and batch independence."""

import dataclasses
import random

import pytest
import torch
from helpers.translating import Engines
from test_search import ARCHS, random_model, random_src

from mtx.config import DecodeConfig
from mtx.decode import rules, search
from mtx.decode.controlled import ConstrainedBeam, matched
from mtx.decode.controls import Segmented
from mtx.decode.request import Request, SearchBatch
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search, greedy_search
from mtx.tokens import EOS_ID

V = 40


def contains(tokens, phrase):
    n = len(phrase)
    return any(tuple(tokens[i : i + n]) == tuple(phrase) for i in range(len(tokens) - n + 1))


def controlled(model, src, requests, beam=4, b=12, nbest=1, alpha=0.6):
    batch = SearchBatch(src, requests)
    steer = ConstrainedBeam(requests, beam, src.device)
    return beam_search(
        model,
        batch,
        SearchSettings(beam=beam, alpha=alpha, max_len_b=b, limit=1024),
        nbest=nbest,
        strategy=steer,
    )


def random_requests(src, seed, prefix=True, avoid=True):
    """Requests of random prefixes (one line in two), one or two random constraints of 1-3
    tokens each and an avoided token the constraints and prefix do not hold."""
    rng = random.Random(seed)
    out = []
    for r in SearchBatch.of(src).requests:
        need = tuple(
            tuple(rng.randrange(4, V) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 2))
        )
        pre = (
            tuple(rng.randrange(4, V) for _ in range(rng.randint(1, 3)))
            if prefix and r.line % 2
            else ()
        )
        used = {t for p in (*need, pre) for t in p}
        bad = ((min(set(range(4, V)) - used),),) if avoid else ()
        out.append(
            Request(r.source, r.line, controls=Segmented(prefix=pre, constraints=need, avoid=bad))
        )
    return out


def test_matched_is_the_longest_beginning_the_output_ends_with():
    window = torch.tensor([[-2, 5, 6, 5], [7, 5, 6, 7]])
    phrases = torch.tensor([[[5, 6, 7], [5, 9, -1]], [[5, 6, 7], [6, 7, -1]]])
    # [.., 5, 6, 5] ends with 5 (of 5 6 7 and of 5 9); [7, 5, 6, 7] with all of 5 6 7
    assert matched(window, phrases).tolist() == [[1, 1], [3, 2]]
    assert matched(window[:, :2], phrases).tolist() == [[1, 1], [1, 0]]


def test_allocate_deals_beams_round_robin_by_bank_and_keeps_score_order_in_one_bank():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]])
    usable = torch.ones(1, 6, dtype=torch.bool)
    one_bank = torch.zeros(1, 6, dtype=torch.long)
    assert rules.allocate(scores, one_bank, usable, 3).tolist() == [[0, 1, 2]]
    banks = torch.tensor([[0, 0, 0, 1, 2, 2]])
    # rank 0 of banks 2, 1, 0 first; then rank 1 of bank 2
    assert rules.allocate(scores, banks, usable, 4).tolist() == [[4, 3, 0, 5]]
    usable[0, 4] = False  # EOS: never a beam
    assert rules.allocate(scores, banks, usable, 3).tolist() == [[5, 3, 0]]
    scores[0, 5] = -torch.inf  # impossible: only when nothing else is left
    assert rules.allocate(scores, banks, usable, 5).tolist() == [[3, 0, 1, 2, 5]]


def test_the_masking_rules_rule_out_exactly_what_they_name():
    lprobs = torch.log_softmax(torch.randn(3, 7, generator=torch.Generator().manual_seed(0)), 1)
    forced = rules.force_tokens(lprobs.clone(), torch.tensor([2, -1, 6]))
    assert torch.equal(forced[1], lprobs[1])  # a free row keeps every token
    for row, tok in ((0, 2), (2, 6)):
        assert forced[row, tok] == lprobs[row, tok]  # its log-probability, not 0
        assert (forced[row] > -torch.inf).sum() == 1
    # the token a row takes where it is forced: what force_tokens' argmax picks
    force = torch.tensor([2, -1, 6])
    taken = rules.take_forced(lprobs.argmax(1), force)
    assert torch.equal(taken, rules.force_tokens(lprobs.clone(), force).argmax(1))
    only = rules.only_tokens(lprobs, torch.tensor([False, True, False]), torch.arange(7) < 3)
    assert torch.equal(only[[0, 2]], lprobs[[0, 2]])
    assert (only[1, 3:] == -torch.inf).all() and torch.equal(only[1, :3], lprobs[1, :3])
    blocked = rules.block_eos(lprobs.clone(), torch.tensor([True, False, False]))
    assert blocked[0, EOS_ID] == -torch.inf and blocked[1, EOS_ID] == lprobs[1, EOS_ID]
    assert torch.equal(blocked[:, EOS_ID + 1 :], lprobs[:, EOS_ID + 1 :])
    banned = rules.ban(lprobs.clone(), torch.tensor([0, 0, 2]), torch.tensor([4, 5, 4]))
    assert (banned == -torch.inf).nonzero().tolist() == [[0, 4], [0, 5], [2, 4]]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_constraints_and_avoided_phrases_are_honoured(arch):
    model, src = random_model(arch=arch, vocab=V), random_src(batch=8, vocab=V)
    requests = random_requests(src, seed=3)
    for beam in (1, 4):
        out = controlled(model, src, requests, beam=beam, b=14)
        for r, hyps in zip(requests, out):
            tokens = hyps[0].tokens
            assert tuple(tokens[: len(r.controls.prefix)]) == r.controls.prefix
            assert all(contains(tokens, c) for c in r.controls.constraints), (r, tokens)
            assert hyps[0].unmet == 0
            assert not any(contains(tokens, a) for a in r.controls.avoid)


def test_the_score_is_the_log_probability_of_the_whole_output():
    """A forced prefix keeps its log-probability: the greedy continuation of a prefix scores
    as the teacher-forced output does."""
    model, src = random_model(vocab=V), random_src(batch=4, vocab=V)
    plain = greedy_search(model, src, SearchSettings(max_len_b=10))
    requests = [
        Request(r.source, r.line, controls=Segmented(prefix=tuple(h.tokens[:2])))
        for r, h in zip(SearchBatch.of(src).requests, plain)
    ]
    for h, c in zip(plain, controlled(model, src, requests, beam=1, b=10, alpha=0.0)):
        assert c[0].tokens == h.tokens  # its own greedy output's prefix changes nothing
        assert c[0].score == pytest.approx(h.score, abs=1e-5)
        assert c[0].log_prob == pytest.approx(h.log_prob, abs=1e-5)


def test_without_controls_the_controlled_search_is_the_beam_search():
    model, src = random_model(vocab=V), random_src(batch=6, vocab=V)
    requests = SearchBatch.of(src).requests
    for beam, alpha in ((4, 0.6), (1, 0.0)):
        a = controlled(model, src, requests, beam=beam, nbest=beam, alpha=alpha)
        b = beam_search(
            model,
            src,
            SearchSettings(beam=beam, alpha=alpha, max_len_b=12, limit=1024),
            nbest=beam,
        )
        assert [[(h.tokens, h.score) for h in x] for x in a] == [
            [(h.tokens, h.score) for h in x] for x in b
        ]


def test_a_sentence_decodes_the_same_alone_and_among_others_controls():
    model, src = random_model(vocab=V), random_src(batch=8, vocab=V)
    requests = random_requests(src, seed=5)
    together = controlled(model, src, requests)
    for i, r in enumerate(requests):
        alone = controlled(model, src[i : i + 1], [r])
        assert (alone[0][0].tokens, alone[0][0].score) == (
            together[i][0].tokens,
            together[i][0].score,
        )


def test_constraints_that_cannot_fit_are_counted_unmet_and_rank_last():
    model, src = random_model(vocab=V), random_src(batch=3, vocab=V)
    need = ((5, 6, 7), (8, 9, 10), (11, 12))  # 8 tokens + EOS
    requests = [
        Request(r.source, r.line, max_len=6, controls=Segmented(constraints=need))
        for r in SearchBatch.of(src).requests
    ]
    for hyps in controlled(model, src, requests, nbest=4):
        assert len(hyps[0].tokens) + 1 <= 6
        assert hyps[0].unmet == sum(not contains(hyps[0].tokens, c) for c in need) > 0
        assert [h.unmet for h in hyps] == sorted(h.unmet for h in hyps)
    fits = [
        Request(r.source, r.line, max_len=9, controls=Segmented(constraints=need))
        for r in SearchBatch.of(src).requests
    ]
    for hyps in controlled(model, src, fits):
        assert hyps[0].unmet == 0 and all(contains(hyps[0].tokens, c) for c in need)


def test_an_avoided_phrase_never_appears():
    """Avoiding the first bigram of each plain output: the output lacks it."""
    model, src = random_model(vocab=V), random_src(batch=6, vocab=V)
    plain = beam_search(model, src, SearchSettings(max_len_b=12))
    requests = [
        Request(r.source, r.line, controls=Segmented(avoid=(tuple(h[0].tokens[:2]),)))
        for r, h in zip(SearchBatch.of(src).requests, plain)
        if len(h[0].tokens) >= 2
    ]
    rows = [i for i, h in enumerate(plain) if len(h[0].tokens) >= 2]
    assert len(rows) >= 4  # the filter leaves something to check (6 random sentences)
    out = controlled(model, src[rows], requests)
    assert len(out) == len(requests)
    for r, hyps in zip(requests, out):
        assert not contains(hyps[0].tokens, r.controls.avoid[0])


def test_alternatives_are_the_best_next_tokens_each_continued_greedily():
    """N alternatives after a prefix: the N most probable tokens there (EOS and the specials
    aside), best first, each continued as greedy search continues the prefix and that token."""
    model, src = random_model(vocab=V), random_src(batch=4, vocab=V)
    searches = Engines(model, torch.device("cpu"))
    d = DecodeConfig(beam=4, max_len_b=10, search="shrinking")
    plain = SearchBatch.of(src).requests
    requests = [
        Request(r.source, r.line, controls=Segmented(prefix=(5, 9)[: r.line % 3], alternatives=3))
        for r in plain
    ]
    out = searches(SearchBatch(src, requests), d, 1)
    memory, src_mask = model.encode(src)
    for i, (r, hyps) in enumerate(zip(requests, out)):
        n = len(r.controls.prefix)
        firsts = [h.tokens[n] for h in hyps]
        tgt_in = torch.tensor([[model.specials.start, *r.controls.prefix]])
        with torch.no_grad():
            logits = model.decode(tgt_in, memory[i : i + 1], src_mask[i : i + 1])[0, -1]
        lprobs = rules.mask_never_produced(
            torch.log_softmax(logits.float(), -1)[None], model.specials
        )[0]
        lprobs[EOS_ID] = -torch.inf
        assert firsts == lprobs.topk(3).indices.tolist()
        for h in hyps:
            alone = Request(r.source, r.line, controls=Segmented(prefix=tuple(h.tokens[: n + 1])))
            greedy = searches(
                SearchBatch(src[i : i + 1], [alone]), dataclasses.replace(d, beam=1), 1
            )
            assert greedy[0][0].tokens == h.tokens
            assert greedy[0][0].log_prob == pytest.approx(h.log_prob, abs=1e-5)


def test_alternatives_are_the_same_alone_and_among_others_and_avoid_what_they_are_told():
    """A sentence's alternatives (with its prefix and phrases to avoid) are the same alone and
    in a batch of other requests, controlled or not."""
    model, src = random_model(vocab=V), random_src(batch=8, vocab=V)
    searches = Engines(model, torch.device("cpu"))
    d = DecodeConfig(beam=4, max_len_b=10, search="shrinking")
    plain = searches(SearchBatch.of(src), dataclasses.replace(d, beam=1), 1)
    requests = []
    for r, h in zip(SearchBatch.of(src).requests, plain):
        prefix = (5, 9)[: r.line % 3]
        # avoid a greedy output's second and third tokens where it has them
        avoid = (tuple(h[0].tokens[1:3]),) if len(h[0].tokens) > 2 and r.line % 2 else ()
        if r.line == 7:  # a line without alternatives among them
            requests.append(Request(r.source, r.line, controls=Segmented(prefix=(5,))))
        else:
            requests.append(
                Request(
                    r.source, r.line, controls=Segmented(prefix=prefix, avoid=avoid, alternatives=3)
                )
            )
    together = searches(SearchBatch(src, requests), d, 1)
    for i, r in enumerate(requests):
        alone = searches(SearchBatch(src[i : i + 1], [r]), d, 1)[0]
        assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in together[i]]
        assert len(alone) == (3 if r.controls.alternatives else 1)
        for h in alone:
            assert tuple(h.tokens[: len(r.controls.prefix)]) == r.controls.prefix
            assert not any(contains(h.tokens, p) for p in r.controls.avoid)
    assert any(r.controls.avoid for r in requests)
    # a phrase begun in the prefix and ended by its second best next token: no alternative
    # takes that token (each alternative reads what the prefix ended with)
    first = Request(requests[0].source, 0, controls=Segmented(prefix=(5, 9), alternatives=3))
    second = searches(SearchBatch(src[:1], [first]), d, 1)[0][1].tokens[2]
    told = dataclasses.replace(first, controls=first.controls.replace(avoid=((9, second),)))
    assert all(h.tokens[2] != second for h in searches(SearchBatch(src[:1], [told]), d, 1)[0])


def test_a_prefix_is_decoded_once_and_each_alternative_costs_its_own_steps(monkeypatch):
    """The decoder reads one row a sentence up to the position of its alternatives, then one
    row an alternative until that alternative ends (ended rows leaving at once)."""
    monkeypatch.setattr(search, "COMPACT", 10**6)
    model, src = random_model(vocab=V), random_src(batch=6, vocab=V)
    searches = Engines(model, torch.device("cpu"))
    d = DecodeConfig(beam=4, max_len_b=10, search="shrinking")
    requests = [
        Request(
            r.source, r.line, controls=Segmented(prefix=(5, 9, 7)[: r.line % 4], alternatives=4)
        )
        for r in SearchBatch.of(src).requests
    ]
    rows, plain = [], model.decode

    def counting(last, *args):
        rows.append(last.size(0))
        return plain(last, *args)

    monkeypatch.setattr(model, "decode", counting)
    out = searches(SearchBatch(src, requests), d, 1)
    n = [len(r.controls.prefix) for r in requests]
    expected = sum(k + 1 + sum(len(h.tokens) - k for h in hyps) for k, hyps in zip(n, out))
    assert sum(rows) == expected
    assert rows[0] == len(requests)  # the first step: one row a sentence
