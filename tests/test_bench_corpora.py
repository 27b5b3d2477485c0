"""The benchmarks of several corpora, fine-tuning and BPE-dropout (benchmarks/multilingual.py,
finetune.py, bpe_dropout.py): what they run is what they say, on a scale a test affords."""

import json

import pytest
import yaml
from conftest import MULTI30K

from benchmarks import bpe_dropout, finetune, multilingual
from mtx import corpora
from mtx.config import load_config


def test_the_fine_tuning_runs_are_configs_finetune_yaml_with_one_change(tmp_path):
    mixed = finetune.corpora(tmp_path / "data", without_old=False)
    alone = finetune.corpora(tmp_path / "data", without_old=True)
    shipped = yaml.safe_load(finetune.CONFIG.read_text())["data"]["corpora"]
    assert [c["name"] for c in mixed] == [c["name"] for c in shipped] == ["new", "old"]
    assert mixed[1]["weight"] == shipped[1]["weight"] and str(MULTI30K) in mixed[1]["train"]
    assert mixed[0]["train"] == f"{tmp_path / 'data'}/ft_train"
    for entries in (mixed, alone):
        cfg = load_config(finetune.CONFIG, [f"data.corpora={json.dumps(entries)}"])
        assert [v.name for v in corpora.valid_sets(cfg.data)] == ["new", "old"]
        assert cfg.train.best_valid == "new"
    assert len(alone) == 1  # the old data's validation set stays, its training data goes
    finetune.cut(tmp_path / "data")
    lines = (tmp_path / "data" / "ft_train.de").read_text(encoding="utf-8").splitlines()
    held_out = (tmp_path / "data" / "ft_test.en").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 400 and len(held_out) == 500


def test_the_multilingual_summary_compares_each_direction():
    rows = [
        {"bilingual en-de": {"test2016": 20.0}, "bilingual de-en": {"test2016": 30.0},
         "both": {"test2016 en-de": 21.0, "test2016 de-en": 29.0, "test2017 en-de": 15.0,
                  "test2017 de-en": 25.0}},
        {"bilingual en-de": {"test2016": 22.0}, "bilingual de-en": {"test2016": 32.0},
         "both": {"test2016 en-de": 23.0, "test2016 de-en": 31.0, "test2017 en-de": 17.0,
                  "test2017 de-en": 27.0}},
    ]  # fmt: skip
    out = multilingual.summary(rows)
    assert out["en-de"]["difference"] == pytest.approx(1.0)
    assert out["de-en"]["difference"] == pytest.approx(-1.0)
    assert out["en-de"]["bilingual_range"] == [20.0, 22.0] and out["de-en"]["both_test2017"] == 26.0


@pytest.mark.slow  # a benchmark's own run
def test_the_sampling_rate_segments_real_pairs(tmp_path):
    figures = bpe_dropout.rate(tmp_path, 0.1, 300)
    assert figures["pairs"] == 300 and figures["pairs_per_s_per_core"] > 0
    assert 1.02 < figures["tokens_per_prepared_token"] < 1.6
    assert 10 < figures["prepared_tokens_per_pair"] < 80
