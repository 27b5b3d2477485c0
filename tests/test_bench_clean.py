"""`mtx bench clean` (mtx/bench/clean.py): the noisy corpus holds the noise it says it holds,
and the rules' precision and recall are counted from the lines `mtx prepare` dropped."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from conftest import MULTI30K, ROOT
from helpers.common import invoke

from mtx.bench.clean import Options, build, rule_table
from mtx.data.clean import normalise

FRENCH = ["Un homme marche dans la rue avec son chien.", "Une femme lit un livre au soleil.",
          "Des enfants jouent au ballon dans le parc."]  # fmt: skip


def small_multi30k(tmp_path: Path, n: int = 600) -> tuple[Path, Path]:
    """The first n training pairs of Multi30k, its val and test2016, and a French file
    line-aligned with them: (the data folder, the French file)."""
    data = tmp_path / "data"
    data.mkdir()
    for lang in ("de", "en"):
        lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:n]
        (data / f"train.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        for split in ("val", "test2016"):
            os.symlink(MULTI30K / f"{split}.{lang}", data / f"{split}.{lang}")
    french = tmp_path / "train.fr"
    french.write_text("".join(FRENCH[i % 3] + "\n" for i in range(n)), encoding="utf-8")
    return data, french


def test_the_noisy_corpus_holds_the_noise_it_names(tmp_path):
    data, french = small_multi30k(tmp_path)
    out = tmp_path / "noisy"
    counts = build(Options(out=out, data=data, third=[french], noise=1 / 3))
    assert counts["clean"] == 600 and counts["copy"] == counts["debris"] == 60  # 300 / 5 kinds
    de, en, kinds = ((Path(f"{out}.{s}").read_text(encoding="utf-8").splitlines())
                     for s in ("de", "en", "kind"))  # fmt: skip
    train = set(zip(*(open(data / f"train.{x}", encoding="utf-8").read().splitlines()
                      for x in ("de", "en"))))  # fmt: skip
    for s, t, kind in zip(de, en, kinds):
        if kind == "clean":
            assert (s, t) in train
        elif kind == "copy":
            assert normalise(s) == normalise(t)
        elif kind == "third":
            assert s in FRENCH or t in FRENCH
        elif kind == "misaligned":
            assert (s, t) not in train
        elif kind == "debris":
            assert any(x in s + t for x in ("\ufffd", "<div", "&nbsp;", "\x1b["))


def test_precision_and_recall_are_counted_from_the_dropped_lines():
    kinds = ["clean", "copy", "copy", "third", "clean"]
    why = {2: "copy", 3: "copy", 4: "langid", 5: "numbers"}  # line -> reason
    rules, per_kind = rule_table(kinds, why)
    by_rule = {r["rule"]: r for r in rules}
    assert by_rule["copy"] == {"rule": "copy", "dropped": 2, "precision": 1.0, "recall": 2 / 3}
    assert by_rule["numbers"]["precision"] == 0.0  # a clean pair
    by_kind = {k["kind"]: k for k in per_kind}
    assert by_kind["clean"]["dropped"] == 0.5 and by_kind["copy"]["by"] == {"copy": 2}


@pytest.mark.slow  # a benchmark's own run
def test_mtx_bench_clean_reports_each_rule(tmp_path):
    data, french = small_multi30k(tmp_path)
    report = tmp_path / "clean.json"
    result = invoke("bench", "clean", "--out", tmp_path / "noisy", "--data", data,
                    "--third", french, "--config", ROOT / "configs/multi30k.yaml",
                    "--set", "data.vocab_size=300", "--json", report,
                    "--langid-lines", f"en={data / 'train.en'}",
                    "--langid-lines", f"de={data / 'train.de'}")  # fmt: skip
    assert result.exit_code == 0, result.output
    r = json.loads(report.read_text())
    rules = {x["rule"]: x for x in r["rules"]}
    kinds = {x["kind"]: x for x in r["by_kind"]}
    assert rules["copy"]["precision"] == 1.0 and kinds["copy"]["dropped"] == 1.0
    assert kinds["debris"]["dropped"] == 1.0 and kinds["clean"]["dropped"] < 0.02
    assert r["kept"] + sum(r["dropped"].values()) == sum(r["kinds"].values())
    assert set(r["seconds_per_million_pairs"]) >= {"langid", "copy", "all"}
    py3 = next(x for x in r["langid"] if x["identifier"] == "py3langid")
    assert py3["accuracy"] > 0.95 and py3["lines_per_s"] > 0
    assert "copy" in result.output and "precision" in result.output
    bad = invoke("bench", "clean", "--out", tmp_path / "x", "--langid-lines", "en")
    assert bad.exit_code != 0 and "--langid-lines expects LANG=FILE" in bad.output
    assert Counter(Path(f"{tmp_path / 'noisy'}.kind").read_text().split())["third"] == 60
