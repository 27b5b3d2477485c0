"""Validation while training (train/validate.py, trainer.py): BLEU and chrF of the validation
split, best.pt by BLEU, early stopping with train.patience (restored on resume), and the
metrics written to TensorBoard."""

import dataclasses
import sys

import pytest
from conftest import run_config
from helpers.common import records

from mtx.checkpoint import Checkpoint, RunDir
from mtx.data.prepared import load_prepared
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.evaluate import score
from mtx.train import trainer
from mtx.train.trainer import train

QUIET = {"log": lambda *_: None}
# BLEU on the first 40 validation lines, with short outputs: a few seconds per validation
BLEU = ["train.bleu_every=1", "train.valid_bleu_lines=40", "decode.max_len_b=12", "decode.beam=2"]


def test_valid_bleu_is_that_of_the_checkpoint_translating_the_split(tmp_path, prepared):
    """Every bleu_every-th validation (and the last) logs the BLEU and chrF that translating
    the validation lines with the checkpoint of that step, as `mtx evaluate` would, gives."""
    run = tmp_path / "run"
    cfg = run_config(
        run, prepared, "train.max_steps=90", "train.valid_every=20", *BLEU, "train.bleu_every=2"
    )
    train(cfg, **QUIET)
    valid = records(run, "valid")
    assert [r["step"] for r in valid] == [20, 40, 60, 80, 90]
    assert ["valid_bleu" in r for r in valid] == [False, True, False, True, True]
    ds = load_prepared(cfg, "valid").select(range(40))
    for r in valid[3:]:  # steps 80 and 90: step-80.pt, last.pt
        path = run / "checkpoints" / ("last.pt" if r["step"] == 90 else "step-80.pt")
        done = Translator.from_checkpoints(path, device="cpu").translate(ds["src"])
        hyps = [t.best.text for t in done]
        expected = score(hyps, ds["tgt"])
        assert (r["valid_bleu"], r["valid_chrf"]) == (expected.bleu, expected.chrf)
        assert 0 < r["bleu_seconds"] <= r["valid_seconds"]
    assert (run / "valid.hyp").read_text().splitlines() == hyps  # the last validation's
    assert valid[-1]["valid_chrf"] > 0


@pytest.fixture
def scripted_bleu(monkeypatch):
    """valid_bleu returns the next of the scores listed in `scores` (no translating)."""
    scores: list[float] = []

    def fake(*args):
        scored = score(["a translation"], ["a translation"])
        return dataclasses.replace(scored, bleu=scores.pop(0), chrf=50.0), ["a translation"]

    monkeypatch.setattr(trainer, "valid_bleu", fake)
    return scores


def test_patience_stops_the_run_and_best_pt_is_best_by_bleu(tmp_path, prepared, scripted_bleu):
    scripted_bleu += [10.0, 20.0, 15.0, 25.0, 25.0, 24.0, 30.0]
    run = tmp_path / "run"
    sets = ["train.max_steps=100", "train.valid_every=5", "train.bleu_every=1"]
    cfg = run_config(run, prepared, *sets, "train.best_metric=bleu", "train.patience=2")
    lines = []
    train(cfg, log=lines.append)
    valid = records(run, "valid")
    # best at step 20 (25.0); steps 25 (25.0, not better) and 30 (24.0) exhaust the patience
    assert [r["step"] for r in valid] == [5, 10, 15, 20, 25, 30]
    assert [r["best"] for r in valid] == [True, True, False, True, False, False]
    assert Checkpoint.load(RunDir(run).best).step == 20
    assert Checkpoint.load(RunDir(run).last).step == 30
    assert lines[-1].startswith(
        "stopped early at step 30: valid bleu has not improved for 2 validations "
        "(train.patience 2); the best, 25.00 at step 20, is "
    )
    # resuming a run that ran out of patience trains no further
    train(cfg, resume=True, **QUIET)
    assert Checkpoint.load(RunDir(run).last).step == 30
    assert scripted_bleu == [30.0]


def test_resume_restores_the_patience_count(tmp_path, prepared, scripted_bleu):
    """Stopped after one validation without improvement, the resumed run stops after one more
    (patience 2), not two."""
    scripted_bleu += [10.0, 20.0, 19.0, 18.0, 30.0]
    run = tmp_path / "run"
    sets = [
        "train.valid_every=5",
        "train.bleu_every=1",
        "train.best_metric=bleu",
        "train.patience=2",
    ]
    train(run_config(run, prepared, "train.max_steps=15", *sets), **QUIET)
    assert [r["step"] for r in records(run, "valid")] == [5, 10, 15]
    train(run_config(run, prepared, "train.max_steps=100", *sets), resume=True, **QUIET)
    assert [r["step"] for r in records(run, "valid")] == [5, 10, 15, 20]
    assert Checkpoint.load(RunDir(run).best).step == 10
    assert scripted_bleu == [30.0]


def test_patience_by_loss_counts_validations_without_a_lower_loss(tmp_path, prepared):
    """The default best_metric is the loss; a learning rate of 0 after the first updates keeps
    it where it is, so the run stops after `patience` validations."""
    run = tmp_path / "run"
    sets = ["train.max_steps=200", "train.valid_every=5", "train.patience=2"]
    lines = []
    train(run_config(run, prepared, *sets, "train.lr_scale=0.0"), log=lines.append)
    valid = records(run, "valid")
    assert [r["step"] for r in valid] == [5, 10, 15]
    assert [r["best"] for r in valid] == [True, False, False]
    assert "valid_bleu" not in valid[0]  # TINY_RUN: bleu_every 0
    assert "valid loss has not improved for 2 validations" in lines[-1]


REQUIRED = {
    "train": {"loss", "nll", "ppl", "lr", "grad_norm", "tokens_per_s", "padding", "skipped"},
    "valid": {"loss", "nll", "ppl", "bleu", "chrf"},
}


def test_tensorboard_holds_every_number_of_metrics_jsonl_once(tmp_path, prepared):
    """Read back with TensorBoard's own reader, after a resume from an older checkpoint (the
    first attempt's later events are dropped: every step appears once)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    sets = ["train.valid_every=10", "train.tensorboard=true", *BLEU]
    train(run_config(run, prepared, "train.max_steps=30", *sets), **QUIET)
    for name in ("last.pt", "step-30.pt"):  # as if the run had died after step 20's checkpoint
        (run / "checkpoints" / name).unlink()
    train(run_config(run, prepared, "train.max_steps=40", *sets), resume=True, **QUIET)
    for kind in ("train", "valid"):
        events = EventAccumulator(str(run / "tensorboard" / kind))
        events.Reload()
        expected: dict[str, list] = {}
        for r in records(run, kind):
            for key, value in r.items():
                if key not in ("kind", "step") and type(value) in (int, float):
                    expected.setdefault(key.removeprefix(f"{kind}_"), []).append((r["step"], value))
        assert REQUIRED[kind] <= set(expected)
        assert set(events.Tags()["scalars"]) == set(expected)
        for tag, values in expected.items():
            logged = [(e.step, e.value) for e in events.Scalars(tag)]
            assert [s for s, _ in logged] == [s for s, _ in values], tag  # once each, in order
            for (_, got), (_, want) in zip(logged, values):
                assert got == pytest.approx(want, rel=1e-6), tag
    assert max(s for s, _ in logged) == 40


def test_tensorboard_missing_is_a_clear_error_before_any_work(tmp_path, prepared, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    run = tmp_path / "run"
    with pytest.raises(MtxError, match="train.tensorboard needs the tensorboard package"):
        train(run_config(run, prepared, "train.max_steps=5", "train.tensorboard=true"), **QUIET)
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
