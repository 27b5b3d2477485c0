"""Several corpora in one model (mtx/corpora.py): the config's corpora and named sets, the
target-language tags in the prepared data, batches mixed by temperature, validation per set,
and exact resume with them."""

import json

import datasets
import numpy as np
import pytest
import torch
from conftest import BOTH_WAYS, TINY_RUN, run_config
from helpers.common import last, records, write_pair
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mtx import corpora
from mtx.config import load_config
from mtx.data import vocab
from mtx.data.prepare import prepare
from mtx.errors import MtxError
from mtx.train.data import Mix, update_batches
from mtx.train.trainer import train
from mtx.train.validate import SetScores, combine

QUIET = {"log": lambda *_: None}


def test_the_one_corpus_keys_are_the_one_entry_case():
    cfg = load_config(None, ["data.src_lang=de", "data.tgt_lang=en", "data.valid=a/val"])
    (c,) = corpora.corpora(cfg.data)
    assert (c.name, c.src_lang, c.tgt_lang, c.train) == ("de-en", "de", "en", "toy:train")
    assert [(v.name, v.spec) for v in c.valid] == [("de-en", "a/val")]
    assert corpora.tags(cfg.data) == []  # one target language: no tag


def test_several_validation_sets_are_named_and_a_best_one_can_be_chosen():
    cfg = load_config(None, ["data.valid=[new=a/val, old=b/val]", "train.best_valid=old"])
    assert [(v.name, v.spec) for v in corpora.valid_sets(cfg.data)] == [
        ("new", "a/val"),
        ("old", "b/val"),
    ]
    unnamed = load_config(None, ["data.valid=[a/val, b/val]"])
    assert [v.name for v in corpora.valid_sets(unnamed.data)] == ["en-de.1", "en-de.2"]


def test_both_directions_get_a_tag_each_and_a_set_each():
    cfg = load_config(None, [BOTH_WAYS])
    assert [c.direction for c in corpora.corpora(cfg.data)] == ["en-de", "de-en"]
    assert corpora.tags(cfg.data) == [">>de<<", ">>en<<"]
    assert [v.name for v in corpora.valid_sets(cfg.data)] == ["en-de", "de-en"]


@pytest.mark.parametrize(
    "sets, message",
    [
        ([BOTH_WAYS, "data.train=x"], "data.train is given with data.corpora"),
        ([BOTH_WAYS, "train.best_valid=fr-de"], "'fr-de' is not a validation set; they are en-de, de-en"),
        (["data.corpora=[{src_lang: en, tgt_lang: de}]"], r"data.corpora\[0\].train is empty"),
        (["data.corpora=[{src_lang: en, tgt_lang: en, train: x}]"], "must differ"),
        (["data.corpora=[{src_lang: en, tgt_lang: de, trian: x}]"], r"did you mean data.corpora\[0\].train"),
        (["data.corpora=[{src_lang: en, tgt_lang: de, train: x, valid: [v]}, "
          "{src_lang: en, tgt_lang: de, train: y}]"], "two corpora are named 'en-de'"),
        (["data.corpora=[{src_lang: en, tgt_lang: de, train: x}]"], "no validation set"),
        (["data.corpora=[{src_lang: en, tgt_lang: de, train: x, valid: [v], weight: 0}]"],
         r"data.corpora\[0\].weight must be positive"),
        (["data.valid=[a=x, a=y]"], "two validation sets are named 'a'"),
        (["data.bpe_dropout=0.1", "train.static_shapes=true"], "use one or the other"),
    ],
)  # fmt: skip
def test_bad_corpora_are_refused_in_one_line_naming_the_key(sets, message):
    with pytest.raises(MtxError, match=message):
        load_config(None, sets)


def test_temperature_upsamples_small_corpora():
    sizes, weights = [9000, 1000], [1.0, 1.0]
    assert np.allclose(corpora.shares(sizes, weights, 1.0), [0.9, 0.1])
    hot = corpora.shares(sizes, weights, 5.0)
    assert 0.1 < hot[1] < 0.5 and np.isclose(hot.sum(), 1.0)
    assert np.allclose(corpora.shares(sizes, weights, 1e9), [0.5, 0.5], atol=1e-6)
    assert np.allclose(corpora.shares(sizes, [1.0, 9.0], 1.0), [0.5, 0.5])  # a weight


def test_an_epoch_draws_its_rows_by_seed_and_epoch_alone():
    corpus = np.array([0] * 90 + [1] * 10)
    p = corpora.shares([90, 10], [1.0, 1.0], 1e9)  # half and half: corpus 1 five times over
    rows = corpora.epoch_rows(corpus, p, seed=1, epoch=0)
    assert len(rows) == 100
    assert np.array_equal(np.bincount(corpus[rows]), [50, 50])
    assert np.array_equal(np.bincount(rows[corpus[rows] == 1]), [0] * 90 + [5] * 10)
    assert len(set(rows[corpus[rows] == 0])) == 50  # without replacement while there are enough
    assert np.array_equal(rows, corpora.epoch_rows(corpus, p, seed=1, epoch=0))
    assert not np.array_equal(rows, corpora.epoch_rows(corpus, p, seed=1, epoch=1))
    whole = corpora.epoch_rows(corpus, corpora.shares([90, 10], [1.0, 1.0], 1.0), 1, 0)
    assert np.array_equal(whole, np.arange(100))  # temperature 1: every row once


def test_prepare_tags_each_source_with_its_target_language(prepared_both_ways):
    manifest = json.loads((prepared_both_ways / "manifest.json").read_text())
    sp = vocab.load_spm((prepared_both_ways / "spm.model").read_bytes())
    assert manifest["tags"] == {"de": 4, "en": 5} == corpora.tag_ids(sp)
    assert ">>en<<" in sp.encode(">>en<< a dog", out_type=str)  # reserved: never split
    train = datasets.load_from_disk(str(prepared_both_ways / "train"))
    group = np.asarray(train["group"])
    assert np.array_equal(np.bincount(group), [12000, 12000])
    firsts = {g: {ids[0] for ids in train.select(np.flatnonzero(group == g)[:200])["src_ids"]}
              for g in (0, 1)}  # fmt: skip
    assert firsts == {0: {4}, 1: {5}}
    # the same pair both ways: the source of one is the target of the other
    en_de, de_en = train[0], train[12000]
    assert (en_de["src"], en_de["tgt"]) == (de_en["tgt"], de_en["src"])
    assert en_de["src_ids"][1:] == de_en["tgt_ids"]
    for split in ("valid", "test"):
        sets = manifest["splits"][split]["sets"]
        assert [(s["name"], s["tgt_lang"], s["kept"]) for s in sets] == [
            ("en-de", "de", 500),
            ("de-en", "en", 500),
        ]


def test_batches_mix_the_corpora_and_every_process_draws_the_same(prepared_both_ways, tmp_path):
    cfg = run_config(tmp_path / "r", prepared_both_ways, BOTH_WAYS, "data.corpus_temperature=5")
    ds = datasets.load_from_disk(str(prepared_both_ways / "train"))
    mix = Mix.of(ds, cfg.data)
    assert np.allclose(mix.shares, [0.5, 0.5])
    mine, _ = update_batches(ds, cfg.train, 0, 0, 0, 1, mix)
    corpus_of = np.asarray(ds["group"])
    mixed = sum(len(set(corpus_of[b])) == 2 for b in mine)
    assert mixed > len(mine) // 2  # directions share batches
    halves = [update_batches(ds, cfg.train, 0, 0, r, 2, mix)[0] for r in (0, 1)]
    assert [b.tolist() for b in halves[0]] == [b.tolist() for b in mine[0::2]][: len(halves[0])]


def test_validation_reports_each_set_and_best_follows_their_mean_or_one():
    per_set = {
        "a": SetScores(loss=2.0, nll=1.0),
        "b": SetScores(loss=4.0, nll=3.0, bleu=20.0, chrf=40.0),
    }
    mean = combine(per_set, "")
    assert mean.summary.loss == 3.0 and mean.sets == per_set
    assert np.isclose(mean.summary.ppl, np.exp(2.0))  # that of the mean NLL
    assert (mean.summary.bleu, mean.summary.chrf) == (20.0, 40.0)  # of the sets that have it
    record = mean.record()  # the metrics.jsonl keys
    assert record["valid_loss"] == 3.0 and record["valid_loss/a"] == 2.0
    assert record["valid_nll/b"] == 3.0 and record["valid_bleu/b"] == 20.0
    assert "valid_bleu/a" not in record and "bleu_seconds" not in record
    assert combine(per_set, "b").summary == per_set["b"]
    one = combine({"a": per_set["a"]}, "")  # one set: its figures, no per-set keys
    assert one.summary == per_set["a"] and not one.sets
    assert set(one.record()) == {"valid_loss", "valid_nll", "valid_ppl", "valid_seconds"}


WHOLE = ["train.max_steps=30", "train.tensorboard=true"]


def test_a_run_of_both_directions_resumes_exactly_and_validates_each(prepared_both_ways, tmp_path):
    settings = [
        BOTH_WAYS,
        "data.corpus_temperature=3",
        "train.valid_every=10",
        "train.bleu_every=1",
    ]
    settings += ["train.valid_bleu_lines=8", "decode.max_len_b=6", "train.update_freq=2"]
    train(run_config(tmp_path / "whole", prepared_both_ways, *WHOLE, *settings), **QUIET)
    train(
        run_config(tmp_path / "parts", prepared_both_ways, "train.max_steps=13", *settings), **QUIET
    )
    cfg = run_config(tmp_path / "parts", prepared_both_ways, "train.max_steps=30", *settings)
    train(cfg, resume=True, **QUIET)
    whole, parts = last(tmp_path / "whole").model, last(tmp_path / "parts").model
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=0, atol=0, msg=name)
    valid = records(tmp_path / "whole", "valid")
    assert [r["step"] for r in valid] == [10, 20, 30]
    for r in valid:
        for key in ("valid_loss", "valid_bleu"):
            both = [r[f"{key}/en-de"], r[f"{key}/de-en"]]
            assert r[key] == pytest.approx(sum(both) / 2)
    hyps = (tmp_path / "whole" / "valid.hyp").read_text().splitlines()
    assert len(hyps) == 16  # 8 lines of each set
    events = EventAccumulator(str(tmp_path / "whole" / "tensorboard" / "valid"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "bleu", "loss/en-de", "loss/de-en", "bleu/en-de", "bleu/de-en"} <= tags


def test_prepared_data_of_one_corpus_is_what_it_was(prepared):
    """The one-corpus case keeps its layout: no tag, one set, every row in group 0."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["tags"] == {} and manifest["src_lang"] == "en"
    assert [s["name"] for s in manifest["splits"]["valid"]["sets"]] == ["en-de"]
    train_ds = datasets.load_from_disk(str(prepared / "train"))
    assert set(train_ds["group"]) == {0}
    cfg = load_config(None, TINY_RUN)
    assert Mix.of(train_ds, cfg.data) is None


def test_a_multilingual_models_vocabulary_tags_the_data_it_encodes(prepared_both_ways, tmp_path):
    """Fine-tuning a multilingual model on one direction: the data, encoded with its
    SentencePiece model, is tagged as the model will be asked to translate; a target language
    it has no tag for is refused in one line."""
    spm_model = f"data.spm_model={prepared_both_ways / 'spm.model'}"
    one_way = [f"run_dir={tmp_path / 'ft'}", *TINY_RUN, spm_model, "data.src_lang=de",
               "data.tgt_lang=en"]  # fmt: skip
    prepare(load_config(None, one_way), log=lambda *_: None)
    train_ds = datasets.load_from_disk(str(tmp_path / "ft" / "prepared" / "train"))
    assert {ids[0] for ids in train_ds.select(range(100))["src_ids"]} == {5}  # >>en<<
    pairs = [("ein hund", "un chien"), ("eine katze", "un chat")] * 5
    for split in ("train", "valid", "test"):
        write_pair(tmp_path / split, *zip(*pairs), langs=("de", "fr"))
    toy_fr = [*one_way[:-1], "data.tgt_lang=fr", f"run_dir={tmp_path / 'fr'}"]
    toy_fr += [f"data.{split}={tmp_path / split}" for split in ("train", "valid", "test")]
    with pytest.raises(
        MtxError, match="no tag >>xx<< for target language.s. fr; the model's tags are for de, en"
    ):
        prepare(load_config(None, toy_fr), log=lambda *_: None)


def test_best_valid_naming_a_set_the_data_was_not_prepared_with_is_refused(prepared, tmp_path):
    cfg = run_config(tmp_path / "r", prepared, "data.valid=[a=x, b=y]", "train.best_valid=b")
    with pytest.raises(MtxError, match="the prepared data's validation sets are en-de; run"):
        train(cfg, **QUIET)
