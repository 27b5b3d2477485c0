import os

import pytest
import torch
from conftest import run_config

from mtx.errors import MtxError
from mtx.train import checkpoint
from mtx.train.trainer import train


def params(run):
    return checkpoint.load(run / "checkpoints" / "last.pt")["model"]


def test_resume_ends_with_the_same_parameters_as_an_uninterrupted_run(tmp_path, prepared):
    quiet = {"log": lambda *_: None}
    # 60 updates of 2 batches of 4096 tokens cross epoch boundaries; resume lands mid-epoch
    big = ["train.max_tokens=4096", "train.update_freq=2"]
    train(run_config(tmp_path / "whole", prepared, "train.max_steps=60", *big), **quiet)
    train(run_config(tmp_path / "parts", prepared, "train.max_steps=25", *big), **quiet)
    first = checkpoint.load(tmp_path / "parts" / "checkpoints" / "last.pt")
    assert first["step"] == 25
    with pytest.raises(MtxError, match="--resume to continue it, --overwrite"):
        train(run_config(tmp_path / "parts", prepared, "train.max_steps=60", *big), **quiet)
    train(
        run_config(tmp_path / "parts", prepared, "train.max_steps=60", *big), resume=True, **quiet
    )
    whole, parts = params(tmp_path / "whole"), params(tmp_path / "parts")
    assert whole.keys() == parts.keys()
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=0, atol=0, msg=name)
    assert checkpoint.load(tmp_path / "parts" / "checkpoints" / "last.pt")["epoch"] >= 1


def test_max_minutes_bounds_a_run_and_both_checkpoints_exist(tmp_path, prepared):
    train(
        run_config(tmp_path / "r", prepared, "train.max_steps=100000", "train.max_minutes=0.0001"),
        log=lambda *_: None,
    )
    train(
        run_config(tmp_path / "r", prepared, "train.max_steps=2"),
        overwrite=True,
        log=lambda *_: None,
    )
    assert checkpoint.load(tmp_path / "r" / "checkpoints" / "last.pt")["step"] == 2
    train(
        run_config(tmp_path / "r", prepared, "train.max_steps=100000", "train.max_minutes=0.0001"),
        overwrite=True,
        log=lambda *_: None,
    )
    last = checkpoint.load(tmp_path / "r" / "checkpoints" / "last.pt")
    best = checkpoint.load(tmp_path / "r" / "checkpoints" / "best.pt")
    assert 1 <= last["step"] < 100
    assert best["config"]["model"]["d_model"] == 32 and isinstance(best["spm_model"], bytes)
    assert "optimizer" not in best


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/mtx-pwned",))


def test_a_checkpoint_whose_pickle_runs_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "payload": Boom()}, path)
    if os.path.exists("/tmp/mtx-pwned"):
        os.remove("/tmp/mtx-pwned")
    with pytest.raises(MtxError, match="not a loadable mtx checkpoint"):
        checkpoint.load(path)
    assert not os.path.exists("/tmp/mtx-pwned")


def test_a_truncated_checkpoint_gives_a_clear_error(tmp_path):
    path = tmp_path / "c.pt"
    checkpoint.save(path, {"model": {"w": torch.ones(1000)}})
    assert checkpoint.load(path)["model"]["w"].sum() == 1000
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(MtxError, match="c.pt"):
        checkpoint.load(path)
    assert oct(path.stat().st_mode & 0o777) != oct(0o777)
