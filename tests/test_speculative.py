"""Speculative greedy search (decode/speculative.py) and its cache (model/ragged.py): the output
is greedy search's, tokens and scores bit for bit, whatever the draft proposes; a row's
positions read through the ragged cache, rejected drafts in between, give the growing cache's
numbers; settings and drafts that cannot work are refused in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers.capability_check import VOCAB, architectures, mixed_lengths, sources
from helpers.common import invoke, mtx, perturbed
from helpers.translating import load, outputs, texts

from mtx.bench.server import Server
from mtx.checkpoint import Checkpoint
from mtx.config import DecodeConfig, ModelConfig
from mtx.decode import engines, tuning
from mtx.decode.controls import Controls
from mtx.decode.languages import Languages
from mtx.decode.options import Options
from mtx.decode.parts import setup_of
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis, SearchSettings
from mtx.decode.search import greedy_search
from mtx.decode.speculative import DraftStats, speculative_search
from mtx.errors import MtxError
from mtx.model import packed
from mtx.model.build import make_model

SETTINGS = SearchSettings(max_len_a=1.0, max_len_b=8)


def model_of(seed: int = 0, **values):
    torch.manual_seed(seed)
    model = make_model(ModelConfig(**values), VOCAB).eval()
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # sharper outputs: sentences of various lengths
    return model


TRANSFORMERS = [
    a for a in architectures() if a["arch"] == "transformer" and "decoder_self" not in a
]
STUDENT = next(a for a in architectures() if a.get("decoder_self") == "ssru")


class Noisy:
    """A draft that proposes the model's tokens through loud noise: mostly wrong."""

    def __init__(self, model, scale: float = 30.0) -> None:
        self.model, self.scale = model, scale
        self.g = torch.Generator().manual_seed(5)
        self.specials, self.encode = model.specials, model.encode
        self.new_ragged_cache = model.new_ragged_cache

    def decode(self, *args):
        out = self.model.decode(*args)
        return out + self.scale * torch.randn(out.shape, generator=self.g)


def hypotheses(hyps) -> list:
    return [(h.tokens, h.score, h.log_prob) for h in hyps]


def drafts(model) -> dict:
    return {"itself": model, "student": model_of(1, **STUDENT), "noise": Noisy(model)}


@pytest.mark.parametrize("values", TRANSFORMERS, ids=lambda a: f"{a['norm']}-{a['positions']}")
def test_the_output_is_greedy_search_s(values):
    model = model_of(**values)
    src = sources()
    kinds = [None, *(k for k in packed.KINDS if packed.available(k))]
    for kind in kinds:
        model.pack(kind)
        greedy = hypotheses(greedy_search(model, src, SETTINGS))
        lengths = {len(h[0]) for h in greedy}
        assert len(lengths) > 2, "the sentences should end at various lengths"
        for name, draft in drafts(model).items():
            if hasattr(draft, "pack"):
                draft.pack(kind)
            for k in (1, 4):
                stats = DraftStats()
                got = hypotheses(speculative_search(model, draft, src, SETTINGS, k, stats))
                assert got == greedy, (kind, name, k)
                assert stats.drafted > 0 and stats.accepted <= stats.drafted
                if name == "itself":
                    assert stats.acceptance == 1.0
                if name == "noise":
                    assert stats.acceptance < 0.5, stats.to_json()


def test_a_sentence_gets_the_same_alone_and_in_any_batch():
    model = model_of(**TRANSFORMERS[0])
    model.pack("fp32")
    draft = Noisy(model, scale=1.0)  # accepts some, rejects some: rows drift apart
    src = sources()
    together = hypotheses(speculative_search(model, draft, src, SETTINGS, 3))
    assert together == hypotheses(greedy_search(model, src, SETTINGS))
    for rows in ([0], [5], list(range(12))[::-1], list(range(0, 12, 2))):
        got = hypotheses(speculative_search(model, draft, src[rows], SETTINGS, 3))
        assert got == [together[i] for i in rows]
    # several padded lengths in one batch (model/groups.py), each source at its own
    mixed, own, order = mixed_lengths(src)
    got = hypotheses(speculative_search(model, draft, mixed, SETTINGS, 3))
    assert got == hypotheses(greedy_search(model, mixed, SETTINGS))
    for k in (0, 7):
        alone = speculative_search(model, draft, own[order[k]], SETTINGS, 3)
        assert hypotheses(alone) == [got[k]]


def test_start_ids_and_short_limits():
    """An NLLB-like start (a code read after the start token) and outputs cut at their own
    longest (1, 2, 3 tokens, EOS included): greedy search's, drafts or not."""
    model = model_of(**TRANSFORMERS[1])
    src = sources(6)
    batch = SearchBatch.of(src)
    requests = [
        dataclasses.replace(r, start=(7,), max_len=[1, 2, 3, None, 2, None][i])
        for i, r in enumerate(batch.requests)
    ]
    batch = SearchBatch(src, requests)
    greedy = hypotheses(greedy_search(model, batch, SETTINGS))
    assert [len(h[0]) for h in greedy][:3] == [0, 1, 2]
    for draft in drafts(model).values():
        assert hypotheses(speculative_search(model, draft, batch, SETTINGS, 4)) == greedy


@pytest.mark.parametrize("values", [TRANSFORMERS[2], STUDENT], ids=["relative", "ssru"])
def test_a_row_read_again_after_rejected_positions_gets_the_growing_cache_s_numbers(values):
    """Two rows at positions of their own, garbage written beyond each and then read again
    (what a rejected draft leaves), against each row decoded alone with a growing cache."""
    model = model_of(**values)
    model.pack("fp32")
    src = sources(2)
    tokens = [[2, 9, 14, 30, 7, 22], [2, 40, 5, 5, 18, 11]]
    memory, mask = model.encode(src)
    expected = []
    for i in range(2):  # each row alone, a position a call
        cache = model.new_cache()
        m, k = model.encode(src[i : i + 1])
        rows = [model.decode(torch.tensor([[t]]), m if j == 0 else None, k, cache)[0, -1]
                for j, t in enumerate(tokens[i])]  # fmt: skip
        expected.append(torch.stack(rows))
    cache = model.new_ragged_cache(16)
    first = model.decode(torch.tensor([[2], [2]]), memory, mask, cache)[:, -1]
    assert torch.equal(first, torch.stack([e[0] for e in expected]))
    recurrent = "decoder_self" in values
    # row 0 reads positions 1-2 and garbage at 3-4; row 1 position 1 and garbage at 2
    calls = [([0, 1], [1, 1], [9, 40]), ([0], [2], [14]), ([0, 1], [3, 2], [50, 51]),
             ([0], [4], [52]), ([0, 1], [3, 2], [30, 5]), ([0, 1], [4, 3], [7, 5]),
             ([0, 1], [5, 4], [22, 18]), ([1], [5], [11])]  # fmt: skip
    if not recurrent:  # a row's several positions in one call, as verifying reads them
        calls = [([0, 0, 1], [1, 2, 1], [9, 14, 40]), ([0, 0, 1], [3, 4, 2], [50, 52, 51]),
                 ([0, 0, 0, 1, 1, 1, 1], [3, 4, 5, 2, 3, 4, 5], [30, 7, 22, 5, 5, 18, 11])]  # fmt: skip
    got: dict[tuple[int, int], torch.Tensor] = {}
    for rows, positions, ids in calls:
        cache.feed(rows, positions, 2, torch.device("cpu"))
        q_mask = mask if cache.rows is None else mask.index_select(0, cache.rows)
        out = model.decode(torch.tensor(ids).unsqueeze(1), None, q_mask, cache)[:, -1]
        for r, p, row in zip(rows, positions, out):
            got[(r, p)] = row  # the last read of a position is the one that counts
    for i in range(2):
        for p in range(1, 6):
            assert torch.equal(got[(i, p)], expected[i][p]), (i, p)


def test_the_draft_loop_reads_what_it_missed():
    """A draft that is the model itself accepts every token; each call adds k + 1 tokens,
    so a sentence of n tokens and EOS takes ceil((n + 1) / (k + 1)) calls after the first."""
    model = model_of(**TRANSFORMERS[0])
    src = sources(1)
    (greedy,) = greedy_search(model, src, SETTINGS)
    stats = DraftStats()
    (got,) = speculative_search(model, model, src, SETTINGS, 2, stats)
    assert got.tokens == greedy.tokens
    n = len(greedy.tokens)  # the first token comes before, then n - 1 tokens and EOS
    assert n > 3 and stats.checks == -(-n // 3)
    assert stats.acceptance == 1.0  # the draft read its last draft when all were accepted


# --- through the Translator and the commands -------------------------------------------------


@pytest.fixture(scope="module")
def pair(multi30k_run, tmp_path_factory):
    teacher = multi30k_run / "checkpoints" / "best.pt"
    draft = perturbed(teacher, tmp_path_factory.mktemp("draft") / "draft.pt", 0.3)
    return teacher, draft


def test_translate_with_a_draft_is_greedy_translation(pair, tmp_path):
    teacher, draft = pair
    src = (Path(__file__).parents[2] / "shared/data/multi30k/test2016.en").read_text()
    lines = src.splitlines()[:60]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n")
    plain = load(teacher, beam=1)
    fast = load(teacher, beam=1, draft=str(draft), draft_tokens=3, draft_adaptive=False)
    assert outputs(fast, lines, draft=True) == outputs(plain, lines)
    stats = fast.stats.drafts
    assert 0.2 < stats.acceptance < 1.0, stats.to_json()
    out = mtx("translate", "--checkpoint", teacher, "--beam", "1", "--draft", draft,
              "--input", tmp_path / "in.en", "--output", tmp_path / "out.de")  # fmt: skip
    assert out.exit_code == 0, out.output
    said = [x for x in out.stderr.splitlines() if x.startswith("drafts: ")]  # what they were worth
    assert len(said) == 1 and said[0].startswith("drafts: batches decoded with 0"), said
    expected = mtx("translate", "--checkpoint", teacher, "--beam", "1", input="\n".join(lines))
    assert (tmp_path / "out.de").read_text() == expected.stdout
    # the record ignores the draft: the same output resumes without it
    again = mtx("translate", "--checkpoint", teacher, "--beam", "1", "--resume",
                "--input", tmp_path / "in.en", "--output", tmp_path / "out.de")  # fmt: skip
    assert again.exit_code == 0, again.output


def test_adaptive_drafts_try_every_length_per_batch_size_and_give_greedy_translation(pair):
    """decode.draft_adaptive (the default): the first batches of each size try greedy search
    without drafts and with 1, 2 and 3 a call, in that order, then the fastest (or, every
    32nd, the way measured least recently); every batch gets greedy search's translations
    whichever way decoded it."""
    teacher, draft = pair
    src = Path(__file__).parents[2] / "shared/data/multi30k/test2016.en"
    lines = src.read_text().splitlines()[:90]
    plain = load(teacher, beam=1)
    fast = load(teacher, beam=1, draft=str(draft), draft_tokens=3)
    for size in (1, 8):
        for i in range(0, size * 10, size):  # a batch of `size` sentences a call
            group = lines[i : i + size]
            assert outputs(fast, group) == outputs(plain, group)
    stats = fast.stats.drafts
    assert sum(stats.batches.values()) == 20
    assert all(stats.batches.get(k, 0) >= 2 for k in (0, 1, 2, 3)), stats.to_json()
    assert 0.2 < stats.acceptance < 1.0, stats.to_json()
    # other settings (here a longest draft of 2) are measured afresh: greedy search alone first
    other = load(teacher, beam=1, draft=str(draft), draft_tokens=2)
    other.translate(lines[:1])
    assert other.stats.drafts.batches == {0: 1}


# slow: three engines' processes (about 20 s); the drafts' searches run in make test above
@pytest.mark.slow
def test_the_decoding_race_runs_fixed_and_adaptive_drafts(pair, tmp_path):
    """mtx bench decode's mtx-draft (k drafts a call, always) and mtx-adaptive-draft (the
    fastest way per batch size, greedy search alone first) give mtx's outputs and say which
    draft lengths decoded the timed round's batches."""
    teacher, draft = pair
    src = Path(__file__).parents[2] / "shared/data/multi30k/test2016.en"
    (tmp_path / "src.en").write_text("\n".join(src.read_text().splitlines()[:24]) + "\n")
    out = mtx("bench", "decode", "--checkpoint", teacher, "--src", tmp_path / "src.en",
              "--engines", "mtx,mtx-draft,mtx-adaptive-draft", "--draft", draft,
              "--draft-tokens", "2", "--beam", "1", "--batch", "8", "--rounds", "1", "--json")  # fmt: skip
    rows = {r["engine"]: r for r in json.loads(out.stdout.splitlines()[-1])["results"]}
    assert rows["mtx-draft"]["same_as_mtx"] == rows["mtx-adaptive-draft"]["same_as_mtx"] == 1.0
    fixed, adaptive = rows["mtx-draft"]["drafts"], rows["mtx-adaptive-draft"]["drafts"]
    assert set(fixed["batches"]) == {"2"} and fixed["drafted"] > 0
    assert set(adaptive["batches"]) <= {"0", "1", "2"}
    assert sum(fixed["batches"].values()) == sum(adaptive["batches"].values())


def test_serve_with_a_draft_answers_greedy_search_s_translations(pair):
    """A real server with a draft answers greedy search's translations and scores; a request
    for a larger beam gets beam search's (the draft speeds up greedy search only)."""
    teacher, draft = pair
    src = Path(__file__).parents[2] / "shared/data/multi30k/test2016.en"
    lines = src.read_text().splitlines()[100:130]
    expected = load(teacher, beam=1).translate(lines)
    beam = texts(load(teacher, beam=4), lines[:4])
    with Server(teacher, "decode.beam=1", f"decode.draft={draft}", "serve.workers=1") as s:
        status, answer = s.translate(lines)
        assert status == 200, answer
        assert answer["translations"] == [t.outputs[0].text for t in expected]
        assert answer["scores"] == [t.outputs[0].score for t in expected]
        status, answer = s.translate(lines[:4], beam=4)
        assert status == 200 and answer["translations"] == beam
        assert s.stop() == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"beam": 4}, "decode.draft: the drafts are verified by greedy search: set decode.beam 1"),
        ({"sampling": True}, "not by decode.sampling"),
        ({"search": "static"}, "not decode.search static"),
    ],
)
def test_settings_a_draft_cannot_run_with_are_refused(pair, change, message):
    teacher, draft = pair
    settings = {"beam": 1, "draft": str(draft), **change}
    with pytest.raises(MtxError, match=message):
        load(teacher, **settings).options(draft=True)


def test_drafts_that_do_not_fit_are_refused(pair, toy_run, tmp_path):
    teacher, draft = pair
    other = toy_run / "checkpoints" / "best.pt"  # another vocabulary
    with pytest.raises(MtxError, match="another vocabulary"):
        load(teacher, beam=1, draft=str(other))
    ckpt = Checkpoint.load(draft)
    flipped = dataclasses.replace(ckpt.config.data, src_lang="de", tgt_lang="en")
    cfg = dataclasses.replace(ckpt.config, data=flipped)
    dataclasses.replace(ckpt, config=cfg).save(tmp_path / "de-en.pt")
    with pytest.raises(MtxError, match=r"translates de->en .*, the model en->de"):
        load(teacher, beam=1, draft=str(tmp_path / "de-en.pt"))
    with pytest.raises(MtxError, match="checkpoint not found"):
        load(teacher, beam=1, draft=str(tmp_path / "missing.pt"))
    result = invoke("translate", "--checkpoint", teacher, "--draft", draft, input="A dog.\n")
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1].endswith("set decode.beam 1 (not 4)")


def refusal(model, d: DecodeConfig) -> str:
    """Why the engine table's drafts engine refuses to decode `model` with settings `d`."""
    languages = Languages("one", {}, ("de",), "en", "de")
    ask = engines.Ask(Controls(), Options.of(d, draft=True), setup_of(model, d, languages, "cpu"))
    return engines.ENGINES["drafts"].supports(ask)


def test_models_that_verify_no_faster_are_refused():
    d = DecodeConfig(beam=1, draft="student.pt")
    assert "a recurrence (an SSRU)" in refusal(model_of(**STUDENT), d)
    rnn = next(a for a in architectures() if a["arch"] == "rnn")
    assert refusal(model_of(**rnn), d) == (
        "decode.draft: RNN has no cache of rows at positions of their own (one Transformer has)"
    )
    assert refusal(model_of(**TRANSFORMERS[0]), d) == ""
    assert "decode.shortlist" in refusal(
        model_of(**TRANSFORMERS[0]), DecodeConfig(beam=1, draft="s.pt", shortlist="s")
    )


# --- decode.draft_adaptive's choice (decode/tuning.py) ---------------------------------------


def test_the_tuner_s_ways_and_batch_sizes():
    assert tuning.ways(4) == [0, 1, 2, 4] and tuning.ways(1) == [0, 1]
    assert tuning.ways(3) == [0, 1, 2, 3] and tuning.ways(8) == [0, 1, 2, 4, 8]
    sizes = [tuning.bucket(n) for n in (1, 2, 4, 5, 16, 17, 64, 65)]
    assert sizes == [0, 1, 1, 2, 2, 3, 3, 4]


class Clock:
    """A clock that a fake search moves on, `cost[size][k]` seconds a token, noting each way
    it is asked to run in `ran`."""

    def __init__(self, cost: dict) -> None:
        self.now, self.cost, self.ran = 0.0, cost, []

    def __call__(self) -> float:
        return self.now

    def search(self, size: int, tokens: int = 10):
        def run(k: int):
            self.now += self.cost[size][k] * tokens
            self.ran.append(k)
            return [Hypothesis(list(range(tokens - 1)), 0.0, 0.0)]  # tokens, EOS included

        return run


def test_the_tuner_explores_then_takes_the_fastest_way_per_batch_size():
    clock = Clock({1: {0: 1.0, 1: 0.8, 2: 0.5, 4: 0.7}, 32: {0: 1.0, 1: 1.4, 2: 1.8, 4: 2.5}})
    tuner = tuning.DraftTuner(4, explore=2, revisit=10, clock=clock)
    for _ in range(20):
        for size in (1, 32):
            tuner.run(size, clock.search(size))
    alone, batched = clock.ran[0::2], clock.ran[1::2]
    assert alone[:8] == [0, 0, 1, 1, 2, 2, 4, 4] and batched[:8] == alone[:8]
    # then the fastest, but for the 10th and 20th batch: the way measured least recently
    assert alone[8:] == [2, 0] + [2] * 9 + [1]
    assert batched[8:] == [0, 1] + [0] * 9 + [2]


def test_the_tuner_follows_a_way_that_becomes_faster():
    """The rates are those of each way's last `window` runs: a way that becomes faster than
    the one chosen is taken once a revisit has measured it."""
    clock = Clock({1: {0: 1.0, 1: 0.5}})
    tuner = tuning.DraftTuner(1, explore=1, window=1, revisit=3, clock=clock)
    for _ in range(6):
        tuner.run(1, clock.search(1))
    assert clock.ran == [0, 1, 0, 1, 1, 0] and tuner.rate(0, 1) > tuner.rate(0, 0)
    clock.cost[1][0] = 0.1  # greedy search alone turns fast (the host's load changed)
    for _ in range(5):
        tuner.run(1, clock.search(1))
    assert clock.ran[6:] == [1, 1, 0, 0, 0]


def test_draft_counts_survive_a_benchmark_worker_s_json():
    """mtx bench decode's workers write DraftStats as JSON; the table reads them back."""
    stats = DraftStats(checks=5, drafted=12, accepted=7, batches={0: 9, 2: 4})
    back = DraftStats.from_json(json.loads(json.dumps(stats.to_json())))
    assert back == stats
    assert back.summary() == (
        "drafts: batches decoded with 0 / 2 drafts a call: 9 / 4; "
        "58.3% of 12 drafted tokens accepted, 1.40 a call"
    )
