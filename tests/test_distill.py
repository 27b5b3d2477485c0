"""mtx distill (jobs/distill.py): the teacher's translations, scored, the worst fraction
dropped, the rest written as a corpus, with the counts and the threshold."""

import json
import subprocess
import sys

import pytest
from helpers.common import invoke

from mtx.data import toy
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.evaluate import SENTENCE_METRICS, sentence_metric
from mtx.jobs.distill import closest, kept_lines, read_nbest

LINES = 120


def distill(run, src, out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mtx", "distill", "--checkpoint",
         str(run / "checkpoints" / "best.pt"), "--device", "cpu", "--src", str(src),
         "--output-dir", str(out), *extra],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_distill_keeps_all_but_the_worst_fraction_of_the_teachers_translations(toy_run, tmp_path):
    src = tmp_path / "train.en"
    sources = [s for s, _ in toy.split_pairs("train")[:LINES]]
    src.write_text("".join(s + "\n" for s in sources))
    out = tmp_path / "distilled"
    done = distill(toy_run, src, out, "--drop-worst", "0.1")
    assert done.returncode == 0, done.stderr
    assert f"kept 108 of {LINES} pairs, dropped 12 (cross-entropy above" in done.stderr
    teacher = (out / "teacher.de").read_text().splitlines()
    assert len(teacher) == LINES
    report = json.loads((out / "distill.json").read_text())
    assert (report["pairs"], report["kept"], report["dropped"]) == (LINES, 108, 12)
    assert report["corpus"] == str(out / "distilled")
    kept_src = (out / "distilled.en").read_text().splitlines()
    kept_tgt = (out / "distilled.de").read_text().splitlines()
    # what was dropped: the 12 pairs the teacher gives the highest cross-entropy
    tr = Translator.from_checkpoints(toy_run / "checkpoints" / "best.pt", [], device="cpu")
    xent = [-s.mean for s in Scorer(tr.parts).score(sources, teacher)]
    keep = kept_lines(xent, 0.1)
    assert kept_src == [s for s, k in zip(sources, keep) if k]
    assert kept_tgt == [t for t, k in zip(teacher, keep) if k]
    kept_x = [x for x, k in zip(xent, keep) if k]
    dropped_x = [x for x, k in zip(xent, keep) if not k]
    assert max(kept_x) <= min(dropped_x)
    assert abs(report["threshold_cross_entropy"] - max(kept_x)) < 1e-9
    # again with another fraction: the translations are complete, so only the filter runs
    again = distill(toy_run, src, out, "--drop-worst", "0.25")
    assert again.returncode == 0, again.stderr
    assert "translated 0 lines" in again.stderr and "kept 90 of 120 pairs" in again.stderr
    assert (out / "teacher.de").read_text().splitlines() == teacher


def test_distill_refuses_a_fraction_outside_0_1_in_one_line(toy_run, tmp_path):
    src = tmp_path / "x.en"
    src.write_text("a\n")
    bad = distill(toy_run, src, tmp_path / "d", "--drop-worst", "1.5")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--drop-worst must be in [0, 1), got 1.5" in bad.stderr
    assert not (tmp_path / "d").exists()


def test_closest_takes_the_translation_nearest_the_reference_and_the_earlier_of_equals():
    refs = ["a man rides a red bike", "two dogs play"]
    groups = [
        ["a woman walks", "a man rides a bike", "a man rides a red bike", "a man rides a red bike"],
        ["two dogs play", "two dogs play"],
    ]
    picks, texts, first, chosen = closest(groups, refs, "bleu")
    # an exact match; of two equal ones, the teacher's better
    assert picks == [2, 0] and texts == [groups[0][2], groups[1][0]]
    assert chosen[0] == pytest.approx(100) and first[0] < chosen[0] - 10
    assert first[1] == chosen[1] == pytest.approx(100)
    for metric in SENTENCE_METRICS:
        similarity = sentence_metric(metric)
        for group, ref, j in zip(groups, refs, closest(groups, refs, metric)[0]):
            assert similarity(group[j], ref) == max(similarity(h, ref) for h in group)


def test_read_nbest_groups_each_lines_translations_and_refuses_a_short_block(tmp_path):
    path = tmp_path / "t.nbest"
    path.write_text(
        "0 ||| x ||| -1.0 ||| -2.0\n0 ||| a ||| b ||| -1.5 ||| -3.0\n"
        "1 ||| y ||| -1.0 ||| -2.0\n1 ||| z ||| -1.2 ||| -2.5\n"
    )
    assert list(read_nbest(path, 2, 2)) == [["x", "a ||| b"], ["y", "z"]]
    with pytest.raises(MtxError, match="line 3: a translation of input line 2 where the 3 of"):
        list(read_nbest(path, 2, 3))
    with pytest.raises(MtxError, match="holds the 2 best of 2 input lines, not of 3"):
        list(read_nbest(path, 3, 2))  # a file cut short
    path.write_text("0 ||| x\n")
    with pytest.raises(MtxError, match=r"t.nbest line 1: not 'LINE \|\|\| TEXT"):
        list(read_nbest(path, 1, 1))


def test_distill_with_references_keeps_each_lines_nbest_translation_nearest_its_reference(
    toy_run, tmp_path
):
    pairs = toy.split_pairs("train")[:40]
    src, ref = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("".join(s + "\n" for s, _ in pairs))
    ref.write_text("".join(t + "\n" for _, t in pairs))
    out = tmp_path / "chosen"
    done = distill(toy_run, src, out, "--ref", str(ref), "--nbest", "4", "--beam", "4")
    assert done.returncode == 0, done.stderr
    groups = list(read_nbest(out / "teacher.de.nbest", 40, 4))
    refs = [t for _, t in pairs]
    picks, texts, first, chosen = closest(groups, refs, "bleu")
    teacher = (out / "closest.de").read_text().splitlines()
    assert teacher == texts == [g[j] for g, j in zip(groups, picks)]
    assert not (out / "teacher.de").exists()  # the 1-best file of a run without --ref
    whole = json.loads((out / "distill.json").read_text())
    assert whole["translations"] == str(out / "closest.de")
    report = whole["chosen"]
    assert report["nbest"] == 4 and report["metric"] == "bleu"
    assert report["not_first"] == sum(1 for j in picks if j)
    assert abs(report["mean_chosen"] - sum(chosen) / 40) < 1e-9
    assert report["mean_chosen"] >= report["mean_first"]
    assert f"{report['not_first']} of 40 not its first" in done.stderr
    # the kept pairs are those chosen translations, filtered as without --ref
    kept = (out / "distilled.de").read_text().splitlines()
    assert len(kept) == 38 and all(t in teacher for t in kept)


def test_distill_refuses_bad_references_in_one_line_before_writing(toy_run, tmp_path):
    src, ref = tmp_path / "x.en", tmp_path / "x.de"
    src.write_text("a house\na dog\n")
    ref.write_text("ein Haus\n")
    paired = tmp_path / "y.de"
    paired.write_text("ein Haus\nein Hund\n")
    cases = [
        (
            ["--ref", str(ref), "--nbest", "2", "--beam", "2"],
            f"{ref} has 1 lines but the sources have 2",
        ),
        (
            ["--ref", str(ref), "--nbest", "1"],
            "--ref needs --nbest 2 or more to choose from, got 1",
        ),
        (["--ref", str(paired), "--nbest", "8"], "nbest 8 needs a beam of at least 8"),
        (["--ref", str(ref), "--select", "ter"], "--select must be one of bleu, chrf, got 'ter'"),
        (["--ref", str(tmp_path / "none.de")], "file not found"),
    ]
    best = toy_run / "checkpoints" / "best.pt"
    for extra, message in cases:  # in this process: a refusal needs no process of its own
        args = ["--checkpoint", best, "--device", "cpu", "--src", src, "--output-dir"]
        bad = invoke("distill", *args, tmp_path / "d", *extra)
        assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1, bad.output
        assert message in bad.output
        assert not (tmp_path / "d").exists()
