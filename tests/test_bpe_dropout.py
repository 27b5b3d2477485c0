"""Subword regularisation on the fly (data/bpe_dropout.py): a pair's segmentation is a function of
(seed, epoch, row) alone: the same for any worker count and after a resume, different from
one epoch to the next, never in validation."""

import itertools
import json
import subprocess
import sys

import datasets
import torch
from conftest import BOTH_WAYS, MULTI30K, TINY_RUN, run_config
from helpers.common import last, records

from mtx.config import load_config
from mtx.data import vocab
from mtx.data.bpe_dropout import Merges, Resegment, pair_seed
from mtx.data.prepared import load_prepared
from mtx.distributed import Dist
from mtx.model.build import make_model
from mtx.tokens import EOS_ID
from mtx.train.data import Mix, sampled, stream
from mtx.train.step import Precision
from mtx.train.trainer import train
from mtx.train.validate import validate

QUIET = {"log": lambda *_: None}


def resegment(prepared, alpha=0.1, seed=1, tagged=False, max_len=250) -> Resegment:
    return Resegment((prepared / "spm.model").read_bytes(), alpha, seed, tagged, max_len)


def test_a_pair_is_segmented_by_seed_epoch_and_row_alone(prepared):
    ds = datasets.load_from_disk(str(prepared / "train")).select(range(200))
    rows, batch = list(range(200)), ds[:]
    r = resegment(prepared)
    e0 = r.for_epoch(0)(rows, batch)
    assert e0 == resegment(prepared).for_epoch(0)(rows, batch)  # a fresh copy: the same
    # in another order, or one pair alone: each pair as before
    backwards = r.for_epoch(0)(rows[::-1], ds[::-1])
    assert backwards == (e0[0][::-1], e0[1][::-1])
    e1 = r.for_epoch(1)(rows, batch)
    changed = sum(a != b for a, b in zip(e0[0], e1[0]))
    assert changed > 20  # another epoch, other segmentations
    assert resegment(prepared, seed=2).for_epoch(0)(rows, batch) != e0
    sp = vocab.load_spm((prepared / "spm.model").read_bytes())
    for ids, text in zip(e0[0] + e0[1], batch["src"] + batch["tgt"]):
        assert ids[-1] == EOS_ID and sp.decode(ids[:-1]) == text  # the same text
    differ = sum(a != b for a, b in zip(e0[0], batch["src_ids"]))
    assert differ > 20
    grown = sum(map(len, e0[0] + e0[1])) / sum(map(len, batch["src_ids"] + batch["tgt_ids"]))
    assert 1.02 < grown < 1.5  # dropped merges: more, shorter pieces
    assert resegment(prepared, alpha=0.0).for_epoch(0)(rows, batch)[0] == batch["src_ids"]
    assert len({pair_seed(1, e, i) for e in range(3) for i in range(1000)}) == 3000


def test_a_tag_stays_first_and_a_too_long_side_keeps_its_prepared_ids(prepared_both_ways):
    ds = datasets.load_from_disk(str(prepared_both_ways / "train"))
    rows = [0, 1, 12000, 12001]
    batch = ds[rows]
    src, tgt = resegment(prepared_both_ways, alpha=0.5, tagged=True).for_epoch(0)(rows, batch)
    assert [s[0] for s in src] == [4, 4, 5, 5]  # >>de<<, >>de<<, >>en<<, >>en<<
    short = resegment(prepared_both_ways, alpha=0.5, tagged=True, max_len=3)
    src, tgt = short.for_epoch(0)(rows, batch)
    assert src == batch["src_ids"] and tgt == batch["tgt_ids"]


def items(prepared, workers: int, epoch: int, batch: int, n: int, *extra) -> list:
    cfg = load_config(None, [*TINY_RUN, f"train.workers={workers}", *extra])
    ds = datasets.load_from_disk(str(prepared / "train"))
    r = resegment(prepared, cfg.data.bpe_dropout, tagged="data.corpora" in str(extra))
    mix = Mix.of(ds, cfg.data)
    loader = stream(ds, cfg.train, epoch, batch, 0, 1, torch.device("cpu"), mix, r)
    return [(b.batch.src.tolist(), b.batch.tgt_out.tolist()) for b in itertools.islice(loader, n)]


def test_any_worker_count_samples_the_same_batches(prepared_both_ways):
    settings = ("data.bpe_dropout=0.1", BOTH_WAYS, "data.corpus_temperature=2")
    one = items(prepared_both_ways, 0, 0, 0, 12, *settings)
    assert items(prepared_both_ways, 2, 0, 0, 12, *settings) == one
    assert items(prepared_both_ways, 1, 0, 5, 7, *settings) == one[5:]  # resumed at batch 5
    plain = items(prepared_both_ways, 0, 0, 0, 12, BOTH_WAYS, "data.corpus_temperature=2")
    assert plain != one


def test_a_run_with_sampling_resumes_exactly_and_validates_on_prepared_ids(tmp_path, prepared):
    settings = ["data.bpe_dropout=0.1", "train.max_tokens=2048", "train.valid_every=10"]
    train(run_config(tmp_path / "whole", prepared, "train.max_steps=24", *settings), **QUIET)
    train(run_config(tmp_path / "parts", prepared, "train.max_steps=11", *settings), **QUIET)
    cfg = run_config(tmp_path / "parts", prepared, "train.max_steps=24", *settings)
    train(cfg, resume=True, **QUIET)
    whole, parts = last(tmp_path / "whole").model, last(tmp_path / "parts").model
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=0, atol=0, msg=name)
    # the same run without sampling trains on other segmentations...
    plain = ["train.max_tokens=2048", "train.valid_every=10", "train.max_steps=24"]
    train(run_config(tmp_path / "plain", prepared, *plain), **QUIET)
    sampled_loss = [r["loss"] for r in records(tmp_path / "whole", "train")]
    assert sampled_loss != [r["loss"] for r in records(tmp_path / "plain", "train")]
    # ...and validation, of the prepared ids, scores a model the same with sampling on or off
    model = make_model(cfg.model, last(tmp_path / "whole").vocab_size)
    model.load_state_dict(whole)
    valid, cpu = load_prepared(cfg, "valid"), torch.device("cpu")
    dist, precision = Dist.from_env(cpu, 60.0), Precision.choose(cpu, "fp32")
    off = load_config(None, [f"run_dir={tmp_path / 'parts'}", *TINY_RUN, *settings[1:]])
    on = validate(model, valid, cfg, precision, dist)
    assert on == validate(model, valid, off, precision, dist)


def test_sampled_batches_hold_about_max_tokens(prepared_both_ways):
    """Sampled segmentations are longer: batches are formed with a budget shrunk by how much
    longer they are on the run's data, so that they hold about train.max_tokens."""
    cfg = load_config(None, [*TINY_RUN, BOTH_WAYS, "data.bpe_dropout=0.1", "train.max_tokens=2048"])
    ds = datasets.load_from_disk(str(prepared_both_ways / "train"))
    proto = (prepared_both_ways / "spm.model").read_bytes()
    r, batching = sampled(cfg, proto, True, ds)
    assert 1.05 < r.tgt_ratio < 2 and batching.max_tokens < 2048
    loader = stream(ds, batching, 0, 0, 0, 1, torch.device("cpu"), Mix.of(ds, cfg.data), r)
    streamed = list(itertools.islice(loader, 60))
    batches = [s.batch for s in streamed]
    fuller = [max(b.src.numel(), b.tgt_out.numel()) for b in batches]
    assert 0.8 * 2048 < sum(fuller) / len(fuller) < 1.1 * 2048  # padded tokens, fuller side
    real = sum(b.tgt_tokens for b in batches)
    normaliser = sum(s.update_tokens for s in streamed)  # update_freq 1: one batch each
    assert abs(normaliser - real) / real < 0.05


def test_without_dropout_the_merges_segment_as_sentencepiece_does(multi30k_run):
    """Merges.sample at alpha 0 is SentencePiece's own BPE segmentation: every line of
    Multi30k's test2016, both languages, with the model of a real corpus."""
    proto = (multi30k_run / "prepared" / "spm.model").read_bytes()
    merges, sp = Merges(proto), vocab.load_spm(proto)
    for lang in ("en", "de"):
        for line in (MULTI30K / f"test2016.{lang}").read_text(encoding="utf-8").splitlines():
            ids = sp.encode(line)
            assert merges.sample(ids, 0.0, 0) == ids, line
            assert sp.decode(merges.sample(ids, 0.3, 1)) == sp.decode(ids)


def test_another_process_samples_the_same_segmentations(prepared):
    """A function of (seed, epoch, row) alone, not of the process: what a loader worker of
    another process (or machine, or a resumed run) draws is what this one draws."""
    code = (
        "import sys, json, datasets; from pathlib import Path; "
        "from mtx.data.bpe_dropout import Resegment; p = Path(sys.argv[1]); "
        "ds = datasets.load_from_disk(str(p / 'train')).select(range(300)); "
        "r = Resegment((p / 'spm.model').read_bytes(), 0.1, 1, False, 250).for_epoch(3); "
        "print(json.dumps(r(list(range(300)), ds[:])))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(prepared)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    ds = datasets.load_from_disk(str(prepared / "train")).select(range(300))
    here = resegment(prepared).for_epoch(3)(list(range(300)), ds[:])
    assert json.loads(out) == [list(here[0]), list(here[1])]
