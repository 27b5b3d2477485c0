"""One rulebook for every search (decode/rules.py): each rule is changed here, and the shrinking
search (decode/search.py), the static search (decode/static.py) and the constrained beam
search (decode/controlled.py, under controls that change nothing) must all follow the change,
and still find the same hypotheses as each other; the alternatives search must follow the
length limit and the tokens never produced. A search that wrote a rule of its own would
ignore the change. The server's CTranslate2 engine and the peer benchmark take
their length limit and suppressed tokens from the same rules."""

import dataclasses
import math

import pytest
import torch
from conftest import tiny_model_config

from mtx.bench.peers import batches
from mtx.config import Config
from mtx.data import vocab
from mtx.decode import rules
from mtx.decode.controlled import Alternatives, ConstrainedBeam
from mtx.decode.controls import Segmented
from mtx.decode.ct2 import ct2_options
from mtx.decode.request import SearchBatch
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search, greedy_search
from mtx.decode.static import StaticSearch
from mtx.decode.translator import Translator
from mtx.model.transformer import Transformer
from mtx.tokens import EOS_ID, PAD_ID, SPECIALS

VOCAB, K, ALPHA, B_LEN, LIMIT = 40, 4, 0.6, 30, 100


@pytest.fixture(scope="module")
def model():
    """A random tiny Transformer whose outputs end at varied lengths (EOS made likelier)."""
    torch.manual_seed(0)
    m = Transformer(tiny_model_config(), VOCAB).eval()
    with torch.no_grad():
        m.embed.weight[EOS_ID] *= 2
    return m


@pytest.fixture(scope="module")
def src():
    g = torch.Generator().manual_seed(5)
    out = torch.randint(4, VOCAB, (9, 8), generator=g)
    for i in range(9):
        n = 2 + i % 6
        out[i, n - 1], out[i, n:] = EOS_ID, PAD_ID
    return out


def both(model, src, beam: int = K, nbest: int = 1) -> tuple[list, list]:
    """The n-best lists of the shrinking and the static search (attending over the written
    positions only, so that the two compute the same numbers: tests/test_static.py), once
    the constrained beam search has been checked to give the shrinking search's."""
    static = StaticSearch(
        model,
        SearchSettings(beam=beam, alpha=ALPHA, max_len_b=B_LEN, limit=LIMIT),
        full=False,
    )(src, nbest=nbest)
    if beam == 1:
        shrinking = [
            [h] for h in greedy_search(model, src, SearchSettings(max_len_b=B_LEN, limit=LIMIT))
        ]
    else:
        shrinking = beam_search(
            model,
            src,
            SearchSettings(beam=beam, alpha=ALPHA, max_len_b=B_LEN, limit=LIMIT),
            nbest=nbest,
        )
    assert tokens(constrained(model, src, beam, nbest)) == tokens(shrinking)
    return shrinking, static


def steered(src, **controls) -> SearchBatch:
    """`src` with the same controls on every sentence."""
    batch = SearchBatch.of(src)
    rows = [dataclasses.replace(r, controls=Segmented(controls)) for r in batch.requests]
    return SearchBatch(batch.src, rows)


def constrained(model, src, beam: int, nbest: int) -> list:
    """The constrained beam search under a control that changes nothing: avoiding PAD, which
    no search produces (at beam 1 without a length penalty, as searches.py runs it)."""
    batch = steered(src, avoid=((PAD_ID,),))
    steer = ConstrainedBeam(batch.requests, beam, src.device)
    alpha = ALPHA if beam > 1 else 0.0
    return beam_search(
        model,
        batch,
        SearchSettings(beam=beam, alpha=alpha, max_len_b=B_LEN, limit=LIMIT),
        nbest=nbest,
        strategy=steer,
    )


def alternatives(model, src, n: int = 3) -> list:
    """`n` alternatives of each sentence after its first token (decode/controlled.py)."""
    batch = steered(src, prefix=(5,), alternatives=n)
    pick = Alternatives(batch.requests, n, src.device)
    return greedy_search(
        model,
        batch,
        SearchSettings(max_len_b=B_LEN, limit=LIMIT),
        pick=pick,
        copies=n,
    )


def tokens(hyps) -> list:
    return [[h.tokens for h in n] for n in hyps]


@pytest.mark.parametrize("beam", [K, 1])
def test_both_searches_take_the_longest_output_from_the_rules(model, src, monkeypatch, beam):
    before = both(model, src, beam)
    assert before[0] == before[1]
    assert max(len(h.tokens) for n in before[0] for h in n) > 3  # the rule has work to do
    real = rules.max_lengths
    monkeypatch.setattr(rules, "max_lengths", lambda n, a, b, limit: real(n, 0.0, 3, limit))
    shrinking, static = both(model, src, beam)
    assert shrinking == static
    assert all(len(h.tokens) + 1 <= 3 for n in shrinking for h in n)  # EOS counts
    assert all(len(h.tokens) + 1 <= 3 for h in alternatives(model, src))


@pytest.mark.parametrize("beam", [K, 1])
def test_both_searches_rule_out_the_tokens_the_rules_rule_out(model, src, monkeypatch, beam):
    before = both(model, src, beam)[0]
    common = max(range(4, VOCAB), key=lambda t: sum(t in h.tokens for n in before for h in n))
    assert any(common in h.tokens for n in before for h in n)
    real = rules.mask_never_produced

    def also_common(lprobs, specials):
        real(lprobs, specials)[:, common] = -torch.inf
        return lprobs

    assert any(common in h.tokens for h in alternatives(model, src))
    monkeypatch.setattr(rules, "mask_never_produced", also_common)
    shrinking, static = both(model, src, beam)
    assert shrinking == static
    assert not any(common in h.tokens for n in shrinking for h in n)
    assert not any(common in h.tokens for h in alternatives(model, src))


def test_both_searches_score_finished_hypotheses_by_the_rules(model, src, monkeypatch):
    monkeypatch.setattr(rules, "finished_score", lambda log_prob, n, alpha: log_prob / n**2)
    shrinking, static = both(model, src, nbest=K)
    assert shrinking == static
    for n in shrinking:
        for h in n:
            assert math.isclose(h.score, h.log_prob / (len(h.tokens) + 1) ** 2, rel_tol=1e-12)


def test_both_searches_rank_the_n_best_by_the_rules(model, src, monkeypatch):
    by_score = both(model, src, nbest=K)[0]
    monkeypatch.setattr(rules, "best", lambda hyps, k: sorted(hyps, key=lambda h: h.score)[:k])
    shrinking, static = both(model, src, nbest=K)
    assert shrinking == static
    assert all([h.score for h in n] == sorted(h.score for h in n) for n in shrinking)
    assert tokens(shrinking) != tokens(by_score)


def test_both_searches_continue_the_candidates_the_rules_choose(model, src, monkeypatch):
    """The rule picks the K worst candidates that do not end instead of the K best."""
    before = both(model, src)[0]

    def worst(tok, k):
        order = (tok == EOS_ID).long() * tok.size(1) - torch.arange(tok.size(1))
        return order.argsort(dim=1)[:, :k]

    monkeypatch.setattr(rules, "continuing", worst)
    shrinking, static = both(model, src)
    assert shrinking == static and tokens(shrinking) != tokens(before)


def test_both_searches_end_a_sentence_when_the_rules_say(model, src, monkeypatch):
    """With `k_finished` a sentence is done at K finished hypotheses; at 1, the first wins."""
    monkeypatch.setattr(rules, "enough_finished", lambda finished, k: finished >= 1)
    shrinking, static = both(model, src, nbest=K)
    assert shrinking == static and all(len(n) == 1 for n in shrinking)


def test_both_searches_finish_the_candidates_the_rules_finish(model, src, monkeypatch):
    """Only the best candidate may finish (Hugging Face's rule without early stopping)."""
    before = both(model, src, nbest=K)[0]
    real = rules.finishing
    monkeypatch.setattr(
        rules, "finishing", lambda top, tok, k: real(top, tok, k) & (top == top[:, :1])[:, :k]
    )
    shrinking, static = both(model, src, nbest=K)
    assert shrinking == static and tokens(shrinking) != tokens(before)


def test_the_peer_benchmark_and_the_ctranslate2_engine_take_the_limit_from_the_rules(
    prepared, monkeypatch
):
    proto = (prepared / "spm.model").read_bytes()
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), vocab.load(proto).get_piece_size())
    tr = Translator(model, Config(), proto, device="cpu")
    lines = ["a dog runs .", "the cat sleeps on the mat ."]
    lengths = [len(tr.parts.codec.encode(line)) - 1 for line in lines]  # EOS excluded
    pieces = [
        [tr.parts.codec.vocab.id_to_piece(i) for i in tr.parts.codec.encode(line)[:-1]]
        for line in lines
    ]
    # mtx's own limit: source tokens + 50, EOS included; CTranslate2 counts no EOS
    assert [limit for limit, _ in batches(tr, lines, 8)] == sorted(n + 50 for n in lengths)
    parts = tr.parts
    limit = parts.model.max_positions - 1

    def options():
        asked = tr.options(beam=4, nbest=2)
        return ct2_options(pieces, asked, limit, parts.model.specials, parts.codec.piece)

    assert options()["max_decoding_length"] == max(lengths) + 50 - 1
    assert [p for [p] in options()["suppress_sequences"]] == ["<pad>", "<unk>", "<s>"]
    monkeypatch.setattr(rules, "max_lengths", lambda n, a, b, limit: 2 * n + 1)
    monkeypatch.setattr(rules, "never_produced", lambda specials: [0])
    assert [limit for limit, _ in batches(tr, lines, 8)] == sorted(2 * n + 1 for n in lengths)
    assert options()["max_decoding_length"] == 2 * max(lengths)
    assert options()["suppress_sequences"] == [["<pad>"]]


@pytest.mark.parametrize("start", ["bos", "pad", "eos"])
@pytest.mark.parametrize("beam", [K, 1])
def test_both_searches_start_from_the_models_start_token_and_rule_out_its_specials(
    src, start, beam
):
    """model.decoder_start: every search's first input is the model's start token, and id 2
    is ruled out where it is BOS, free where it is a piece (an imported MarianMT
    vocabulary: pad)."""
    torch.manual_seed(0)
    m = Transformer(tiny_model_config(decoder_start=start, output_bias=True), VOCAB).eval()
    with torch.no_grad():
        m.logits_bias[2] = 50.0  # id 2 first wherever it is allowed
    first_inputs = []
    real = m.decode

    def decode(tgt_in, *args, **kwargs):
        first_inputs.append(int(tgt_in[0, 0]))
        return real(tgt_in, *args, **kwargs)

    m.decode = decode
    settings = SearchSettings(beam=beam, alpha=ALPHA, max_len_b=B_LEN, limit=LIMIT)
    static = StaticSearch(m, settings, full=False)

    def shrinking():
        if beam == 1:
            return [[h] for h in greedy_search(m, src, settings)]
        return beam_search(m, src, settings)

    for search in (lambda: static(src), shrinking):
        first_inputs.clear()
        outputs = {t for n in search() for h in n for t in h.tokens}
        assert (2 in outputs) == (start == "pad")
        assert first_inputs[0] == SPECIALS[start].start


def test_top_candidates_in_place_gives_the_same_candidates():
    """Beam search adds the beams' scores into the step's log-probabilities in place (a fresh
    (B, K x V) tensor a step costs the CPU its page faults): the same numbers, ties and ruled-out
    tokens included, as the addition into a new tensor that the constrained search keeps."""
    g = torch.Generator().manual_seed(3)
    B, V = 5, 12
    lprobs = torch.log_softmax(torch.randn(B * K, V, generator=g), dim=-1)
    lprobs[:, :3] = -torch.inf  # the tokens never produced
    lprobs[1, 7] = lprobs[1, 8]  # a tie within a beam
    lprobs[5] = lprobs[4]  # two beams alike
    scores = rules.start_beams(torch.empty(B, K))
    scores[2:] = torch.randn(B - 2, K, generator=g)
    kept = lprobs.clone()
    expected = rules.top_candidates(scores, kept, K)
    assert torch.equal(kept, lprobs)  # the default leaves its input alone
    got = rules.top_candidates(scores, lprobs, K, in_place=True)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert not torch.equal(lprobs, kept)  # written over: the caller's to give up
