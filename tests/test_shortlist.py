"""Lexical shortlists (decode/shortlist.py): built from co-occurrence counts, kept in a file
tied to its vocabulary, and decoding over each sentence's candidates only, the same alone as
in any batch. (Under each CPU capability: tests/helpers/capability_check.py.)"""

import numpy as np
import pytest
import torch
from helpers.common import invoke, mtx
from helpers.translating import outputs

from mtx.data import toy
from mtx.decode import rules
from mtx.decode.shortlist import Shortlist, bucket_length, vocabulary_sha256
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.jobs import shortlist as shortlist_jobs
from mtx.jobs.shortlist import build
from mtx.model.build import load_model
from mtx.tokens import EOS_ID

CONFIG = "configs/toy.yaml"


def test_build_ranks_what_a_source_piece_comes_with_and_counts_the_frequent():
    # 20 comes with source piece 10 only, 22 with 12, 23 with 13; 21 and 5 come with all
    pairs = [([10, 11], [20, 21, 5])] * 6 + [([12, 11], [22, 21, 5])] * 6
    pairs += [([13], [21, 5, 23])] * 2
    built = build(iter(pairs), 30, top=2, frequent=2, vocabulary="v")
    assert built.top[10].tolist() == [20, 5]  # then 5 and 21 tie (weight 0): the lower id
    assert built.top[12].tolist() == [22, 5] and built.top[13].tolist() == [23, 5]
    assert built.top[29].tolist() == [-1, -1]  # never seen
    assert built.frequent.tolist() == [5, 21]  # in all 14 pairs
    candidates = built.candidates(torch.tensor([10, 13, EOS_ID, 0, 0]))  # EOS, then padding
    assert candidates.tolist() == [EOS_ID, 5, 20, 21, 23]


def test_counting_in_chunks_gives_the_same_shortlist(monkeypatch):
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(4, 60, 7).tolist(), rng.integers(4, 60, 9).tolist()) for _ in range(50)]
    whole = build(iter(pairs), 60, 5, 4, "v")
    monkeypatch.setattr(shortlist_jobs, "CHUNK", 7)
    chunked = build(iter(pairs), 60, 5, 4, "v")
    assert np.array_equal(whole.top, chunked.top)
    assert np.array_equal(whole.frequent, chunked.frequent)


def test_a_shortlist_file_round_trips_and_bad_ones_are_refused(tmp_path):
    built = build(iter([([5, 6], [7, EOS_ID])]), 10, 3, 2, "abc")
    built.save(tmp_path / "s.npz")
    back = Shortlist.load(tmp_path / "s.npz")
    assert np.array_equal(back.top, built.top) and back.vocabulary == "abc"
    with pytest.raises(MtxError, match="file not found"):
        Shortlist.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_text("not a shortlist")
    with pytest.raises(MtxError, match="is not a shortlist"):
        Shortlist.load(tmp_path / "bad.npz")
    with pytest.raises(MtxError, match="another vocabulary"):
        back.check("xyz", 10, "s.npz")


def test_bucket_lengths_are_powers_of_two_from_64():
    assert [bucket_length(n) for n in (1, 64, 65, 128, 129, 700)] == [64, 64, 128, 128, 256, 1024]


@pytest.fixture(scope="module")
def toy_shortlist(toy_run):
    path = toy_run / "shortlist.npz"
    done = mtx("shortlist", "--config", CONFIG, "--set", f"run_dir={toy_run}", "--top", "8",
               "--frequent", "10")  # fmt: skip
    assert "candidates a sentence on average" in done.output and path.is_file()
    return path


def translator(run, path, *sets) -> Translator:
    sets = [f"decode.shortlist={path}", *sets] if path else list(sets)
    return Translator.from_checkpoints(run / "checkpoints" / "best.pt", sets, device="cpu")


@pytest.mark.parametrize("sets", [["decode.beam=4"], ["decode.beam=1"], ["decode.dtype=int8"]])
def test_a_sentence_decodes_the_same_alone_and_in_a_batch_through_a_shortlist(
    toy_run, toy_shortlist, sets
):
    tr = translator(toy_run, toy_shortlist, *sets)
    lines = [s for s, _ in toy.split_pairs("test")[:40]]
    together = outputs(tr, lines, nbest=1)
    for i, line in enumerate(lines):
        alone = outputs(tr, [line])[0]
        assert [(h.tokens, h.score) for h in alone] == [(h.tokens, h.score) for h in together[i]]
    # every output piece is one of the sentence's candidates
    table = Shortlist.load(toy_shortlist)
    for line, hyps in zip(lines, together):
        allowed = set(table.candidates(torch.tensor(tr.parts.codec.encode(line))).tolist())
        assert set(hyps[0].tokens) <= allowed


def test_a_shortlist_of_the_whole_vocabulary_translates_as_none(toy_run, tmp_path):
    plain = translator(toy_run, None)
    vocab = plain.parts.model.vocab_size
    spm_proto = load_model(toy_run / "checkpoints" / "best.pt")[2]
    everything = np.arange(vocab, dtype=np.int32)
    whole = Shortlist(np.zeros((vocab, 0), np.int32), everything, vocabulary_sha256(spm_proto))
    whole.save(tmp_path / "all.npz")
    listed = translator(toy_run, tmp_path / "all.npz")
    lines = [s for s, _ in toy.split_pairs("test")[:60]]
    for beam in (4, 1):
        a = outputs(plain, lines, beam=beam)
        b = outputs(listed, lines, beam=beam)
        assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
        assert np.allclose([h[0].score for h in a], [h[0].score for h in b], atol=1e-4)


def test_a_shortlisted_search_rules_out_what_the_rules_rule_out(
    toy_run, toy_shortlist, monkeypatch
):
    tr = translator(toy_run, toy_shortlist)
    lines = [s for s, _ in toy.split_pairs("test")[:20]]
    before = [h[0].tokens for h in outputs(tr, lines)]
    common = max({t for out in before for t in out}, key=lambda t: sum(t in o for o in before))
    real = rules.mask_never_produced

    def also_common(lprobs, specials):
        real(lprobs, specials)[:, common] = -torch.inf
        return lprobs

    monkeypatch.setattr(rules, "mask_never_produced", also_common)
    for beam in (4, 1):
        after = [h[0].tokens for h in outputs(tr, lines, beam=beam)]
        assert not any(common in out for out in after)
    real_max = rules.max_lengths
    monkeypatch.setattr(rules, "max_lengths", lambda n, a, b, limit: real_max(n, 0.0, 3, limit))
    assert all(len(h[0].tokens) + 1 <= 3 for h in outputs(tr, lines))  # EOS counts


def test_translate_takes_a_shortlist_and_refuses_a_bad_one_in_one_line(toy_run, toy_shortlist):
    ckpt = str(toy_run / "checkpoints" / "best.pt")
    lines = "".join(s + "\n" for s, _ in toy.split_pairs("test")[:5])
    done = mtx("translate", "--checkpoint", ckpt, "--shortlist", str(toy_shortlist), input=lines)
    assert len(done.stdout.splitlines()) == 5
    bad = invoke("translate", "--checkpoint", ckpt, "--shortlist", "/nonexistent.npz", input=lines)
    assert bad.exit_code == 2 and bad.stdout == ""
    assert "decode.shortlist: file not found: /nonexistent.npz" in bad.output
    static = invoke("translate", "--checkpoint", ckpt, "--shortlist", str(toy_shortlist), "--set",
                    "decode.search=static", input=lines)  # fmt: skip
    assert static.exit_code == 2 and "runs in the shrinking search only" in static.output


def test_an_ensemble_with_a_shortlist_is_refused_in_one_line(toy_run, toy_shortlist):
    checkpoints = toy_run / "checkpoints"
    refused = invoke("translate", "--checkpoint", checkpoints / "best.pt", "--checkpoint",
                     checkpoints / "step-125.pt", "--shortlist", toy_shortlist, input="a\n")  # fmt: skip
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "decode.shortlist takes one model, not an ensemble" in refused.output
