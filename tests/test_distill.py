"""mtx distill (decode/distill.py): the teacher's translations, scored, the worst fraction
dropped, the rest written as a corpus, with the counts and the threshold."""

import json
import subprocess
import sys

from mtx.data import toy
from mtx.decode.distill import kept_lines
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator

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
    tr = Translator.from_checkpoint(toy_run / "checkpoints" / "best.pt", [], device="cpu")
    xent = [-s.mean for s in Scorer(tr).score(sources, teacher)]
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
