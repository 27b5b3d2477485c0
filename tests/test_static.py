"""The static search (decode/static.py) against the shrinking one (decode/search.py)."""

import pytest
import torch
from conftest import MULTI30K, tiny_model_config
from helpers.translating import outputs

from mtx.decode import engines
from mtx.decode.controls import Controls
from mtx.decode.rules import SearchSettings
from mtx.decode.search import beam_search, greedy_search
from mtx.decode.static import StaticSearch, rows_bucket
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.model.cache import StaticCache
from mtx.model.transformer import Transformer
from mtx.tokens import EOS_ID, PAD_ID


def sources(B: int, S: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """B sources of lengths 2.. (EOS included), padded to S."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (B, S), generator=g)
    for i in range(B):
        n = 2 + i % (S - 1)
        src[i, n - 1], src[i, n:] = EOS_ID, PAD_ID
    return src


@pytest.fixture(scope="module")
def model():
    """A random tiny Transformer whose EOS is likely enough that its outputs end at varied
    lengths, from none to over 30 tokens (the bookkeeping of finished hypotheses and the
    cache's windows of 16 positions are then exercised)."""
    torch.manual_seed(0)
    m = Transformer(tiny_model_config(), 40).eval()
    with torch.no_grad():
        m.embed.weight[EOS_ID] *= 2
    return m


def test_rows_bucket_is_the_next_power_of_two():
    assert [rows_bucket(n) for n in (1, 2, 3, 4, 5, 31, 32, 33)] == [1, 2, 4, 4, 8, 32, 32, 64]


def same(a, b, tolerance: float) -> bool:
    """The same n-best lists: tokens equal, scores and log-probabilities within `tolerance`."""
    pairs = [(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True)]
    return all(
        x.tokens == y.tokens
        and abs(x.score - y.score) <= tolerance
        and abs(x.log_prob - y.log_prob) <= tolerance
        for x, y in pairs
    )


def both_searches(model, src, K: int, full: bool) -> tuple[list, list]:
    """The n-best lists (K of them) of the static and the shrinking search, beam K (1: greedy),
    alpha 0.6, output limits 1.0 x source + 30, at most 100."""
    static = StaticSearch(model, SearchSettings(beam=K, max_len_b=30, limit=100), full=full)(
        src, nbest=K
    )
    if K > 1:
        return static, beam_search(
            model,
            src,
            SearchSettings(beam=K, max_len_b=30, limit=100),
            nbest=K,
        )
    return static, [[h] for h in greedy_search(model, src, SearchSettings(max_len_b=30, limit=100))]


@pytest.mark.parametrize("full", [False, True])
def test_static_beam_and_greedy_find_what_the_shrinking_search_finds(model, full):
    """Every hypothesis of the n-best lists, beam 4 and greedy: attending over the written
    positions, the same bit for bit; over windows of the cache, the same tokens with scores
    rounded otherwise (within 1e-4)."""
    src = sources(11, 9, 40)
    for K in (4, 1):
        static, shrinking = both_searches(model, src, K, full)
        assert static == shrinking if not full else same(static, shrinking, 1e-4)
        lengths = {len(h.tokens) for hyps in static for h in hyps}
        assert len(lengths) > 3 and max(lengths) > 2 * StaticCache.WINDOW  # several windows


def test_a_sentence_gets_the_same_hypotheses_alone_and_in_any_bucket(model):
    src = sources(13, 10, 40, seed=1)
    search = StaticSearch(model, SearchSettings(max_len_b=30, limit=100))
    together = search(src, nbest=4)  # 13 sentences: rows bucket 16
    assert together == [search(src[i : i + 1], nbest=4)[0] for i in range(13)]  # bucket 1
    assert together[::-1] == search(src.flip(0), nbest=4)
    assert together[:5] == search(src[:5], nbest=4)  # bucket 8


def test_the_static_state_is_reused_clean_from_one_search_to_the_next(model):
    """A search leaves nothing behind that the next one of the same shape reads."""
    a, b = sources(4, 8, 40, seed=2), sources(4, 8, 40, seed=3)
    search = StaticSearch(model, SearchSettings(max_len_b=30, limit=100))
    first = search(a)
    search(b)
    assert search(a) == first


def test_relative_and_learned_positions_decode_over_the_static_cache():
    src = sources(6, 8, 40, seed=4)
    for positions in ("relative", "learned"):
        torch.manual_seed(1)
        m = Transformer(tiny_model_config(positions=positions), 40).eval()
        with torch.no_grad():
            m.embed.weight[EOS_ID] *= 2
        static = StaticSearch(m, SearchSettings(max_len_b=30, limit=100))(src, nbest=2)
        assert same(
            static,
            beam_search(
                m,
                src,
                SearchSettings(max_len_b=30, limit=100),
                nbest=2,
            ),
            1e-4,
        )
        assert max(len(h.tokens) for hyps in static for h in hyps) > StaticCache.WINDOW


def test_decode_search_refuses_what_the_static_search_cannot_do(multi30k_run):
    ckpt = multi30k_run / "checkpoints" / "best.pt"
    cases = {
        ("decode.search=graphs",): "CUDA graphs need a CUDA device",
        ("decode.search=static", "decode.sampling=true"): "sampling runs in the shrinking",
        ("decode.search=static", "decode.stopping=exact"): "stopping exact runs in the",
    }
    for sets, message in cases.items():
        tr = Translator.from_checkpoints(ckpt, list(sets), device="cpu")
        with pytest.raises(MtxError, match=message):
            tr.translate(["A dog."])
    # auto on the CPU is the shrinking search, whatever the settings
    tr = Translator.from_checkpoints(
        ckpt, ["decode.search=auto", "decode.sampling=true"], device="cpu"
    )
    chosen = engines.choose(Controls(), tr.options(), tr.parts.setup)
    assert chosen.name == "sampling" and len(tr.translate(["A dog."])) == 1


def translate_test2016(
    multi30k_run, beam: int, search: str, full: bool = True, batch_tokens: int = 8000, n=1000
):
    """The best hypothesis (tokens, score) of test2016's first `n` lines with `decode.search`."""
    lines = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:n]
    sets = [f"decode.beam={beam}", f"decode.search={search}", f"decode.batch_tokens={batch_tokens}"]
    tr = Translator.from_checkpoints(multi30k_run / "checkpoints" / "best.pt", sets, device="cpu")
    if not full:  # the static search attending over the written positions only
        d = tr.parts.config.decode
        limit = tr.parts.model.cfg.max_positions - 1
        prefix = StaticSearch(
            tr.parts.model,
            SearchSettings(
                beam=d.beam,
                alpha=d.alpha,
                max_len_a=d.max_len_a,
                max_len_b=d.max_len_b,
                limit=limit,
            ),
            full=False,
        )
        tr._run.static = lambda options, graphs: prefix  # the runtime's static search
    return [(h[0].tokens, h[0].score) for h in outputs(tr, lines)]


@pytest.mark.parametrize(
    "beam, n",
    [
        (4, 200),
        (1, 200),
        pytest.param(4, 1000, marks=pytest.mark.slow),
        pytest.param(1, 1000, marks=pytest.mark.slow),
    ],
)
def test_test2016_static_search_translates_as_the_shrinking_one(multi30k_run, beam, n):
    """Multi30k test2016 (all of it in the slow run, its first 200 lines in the fast one):
    attending over the written positions, the same hypotheses bit for bit; over the full
    cache, the same translations but for near-ties (the two searches' best scores within
    1e-4), at most 1% of lines, and independent of the batch."""
    shrinking = translate_test2016(multi30k_run, beam, "shrinking", n=n)
    assert len({tuple(tokens) for tokens, _ in shrinking}) > n // 10  # varied translations
    assert translate_test2016(multi30k_run, beam, "static", full=False, n=n) == shrinking
    full = translate_test2016(multi30k_run, beam, "static", n=n)
    differ = [(a, b) for a, b in zip(full, shrinking) if a[0] != b[0]]
    assert len(differ) <= len(full) // 100, len(differ)
    assert all(abs(a[1] - b[1]) < 1e-4 for a, b in differ), differ
    assert all(abs(a[1] - b[1]) < 1e-4 for a, b in zip(full, shrinking))
    assert translate_test2016(multi30k_run, beam, "static", batch_tokens=64, n=n) == full
