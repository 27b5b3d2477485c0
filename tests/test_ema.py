"""train.ema (train/ema.py): the moving average's formula, no host wait, the average in the
checkpoints and in validation, the trained weights beside it, and an exact resume."""

import math

import pytest
import torch

from mtx.checkpoint import Checkpoint
from mtx.config import load_config
from mtx.errors import MtxError
from mtx.train.ema import Ema
from mtx.train.trainer import quiet, train
from tests.conftest import run_config
from tests.helpers.common import assert_same_parameters, invoke, mtx, records
from tests.test_step import HostWaits


def test_the_average_moves_towards_the_weights_by_one_minus_the_decay():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ema, decay = Ema(model, 0.75), 0.75
    expected = {k: v.clone() for k, v in start.items()}
    for _ in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        with HostWaits() as mode:
            ema.update(model)
        assert mode.waits == []  # device work only
        for name, p in model.named_parameters():
            expected[name] = decay * expected[name] + (1 - decay) * p.detach()
    for name, avg in ema.state_dict().items():
        torch.testing.assert_close(avg, expected[name], rtol=1e-6, atol=1e-6)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped(model):
        for name, p in model.named_parameters():
            assert torch.equal(p.detach(), ema.state_dict()[name])
    for name, p in model.named_parameters():  # its own weights again, bit for bit
        assert torch.equal(p.detach(), trained[name])
    assert all(torch.equal(ema.weights(model)[k], ema.state_dict()[k]) for k in trained)


EMA_RUN = ["train.ema=0.9", "train.valid_every=10", "train.max_steps=30", "train.bleu_every=0"]


def test_a_run_with_ema_checkpoints_the_average_and_resumes_exactly(tmp_path, prepared):
    whole, split = tmp_path / "whole", tmp_path / "split"
    train(run_config(whole, prepared, *EMA_RUN), log=quiet)
    train(run_config(split, prepared, *EMA_RUN[:-1], "train.max_steps=20"), log=quiet)
    train(run_config(split, prepared, *EMA_RUN), resume=True, log=quiet)
    for name in ("last.pt", "best.pt", "step-30.pt"):
        assert_same_parameters(whole / "checkpoints" / name, split / "checkpoints" / name)
    last = Checkpoint.load(whole / "checkpoints" / "last.pt")
    resumed = Checkpoint.load(split / "checkpoints" / "last.pt")
    raw = last.resume.raw_model
    assert raw is not None and raw.keys() == last.model.keys()
    assert all(torch.equal(raw[k], resumed.resume.raw_model[k]) for k in raw)
    differ = [k for k in raw if not torch.equal(raw[k], last.model[k])]
    assert len(differ) > len(raw) // 2  # the average is not the trained weights


def test_validation_scores_the_average(tmp_path, prepared):
    """The same run with the average off and on: the training is the same (the average is
    never trained), the validation loss is not, and the run without it checkpoints the
    trained weights, which are the run with it's raw weights."""
    off, on = tmp_path / "off", tmp_path / "on"
    train(run_config(off, prepared, *EMA_RUN[1:]), log=quiet)
    result = train(run_config(on, prepared, *EMA_RUN), log=quiet)
    plain = Checkpoint.load(off / "checkpoints" / "last.pt")
    smoothed = Checkpoint.load(on / "checkpoints" / "last.pt")
    assert all(torch.equal(plain.model[k], smoothed.resume.raw_model[k]) for k in plain.model)
    assert smoothed.resume.raw_model is not None and plain.resume.raw_model is None
    assert math.isfinite(result.summary.loss)
    assert records(on, "valid")[-1]["valid_loss"] != records(off, "valid")[-1]["valid_loss"]
    # `mtx average --raw`: the run without the average, from the run with it
    mtx("average", on / "checkpoints" / "last.pt", "--raw", "--output", tmp_path / "raw.pt")
    raw = Checkpoint.load(tmp_path / "raw.pt")
    assert all(torch.equal(plain.model[k], raw.model[k]) for k in plain.model)
    failed = invoke("average", off / "checkpoints" / "last.pt", "--raw", "--output", tmp_path / "x")
    assert failed.exit_code != 0 and "holds no raw weights" in failed.output
    assert not (tmp_path / "x").exists()


def test_ema_settings_are_checked_in_one_line():
    with pytest.raises(MtxError, match=r"train.ema must be in \[0, 1\), got 1"):
        load_config(None, ["train.ema=1"])
    with pytest.raises(MtxError, match="train.ema averages fp32 weights"):
        load_config(None, ["train.ema=0.999", "train.precision=bf16-weights"])
