"""Faults lose nothing: non-finite updates, out-of-memory batches, signals, kill -9, bad checkpoints."""

import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_config, run_overrides, tiny_model_config
from helpers.common import assert_same_parameters, invoke, last, records

from mtx.config import Config, load_config
from mtx.data.batching import collate
from mtx.errors import MtxError
from mtx.files import atomic_write
from mtx.model.transformer import Transformer
from mtx.train import step as train_step_module
from mtx.train.step import make_optimizer, train_step
from mtx.train.trainer import train


def quiet(*_):
    pass


# Checkpoints every 10 updates, two step checkpoints kept.
FAULT_RUN = ["train.max_steps=80", "train.valid_every=10", "train.keep_last=2"]


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("whole")
    train(run_config(run, prepared, *FAULT_RUN), log=quiet)
    return run


def same_runs(run_a, run_b, name="last.pt"):
    assert_same_parameters(run_a / "checkpoints" / name, run_b / "checkpoints" / name)


def last_logged_step(run) -> int:
    """The highest step in a metrics file that a running process is writing."""
    return max((r["step"] for r in records(run)), default=-1)


def start_training(run, *flags):
    """`mtx train` on the FAULT_RUN settings in a child process."""
    config = run / "tiny.yaml"
    if not config.exists():
        config.write_text(
            yaml.safe_dump(load_config(None, run_overrides(run, *FAULT_RUN)).to_dict())
        )
    cmd = [sys.executable, "-m", "mtx", "train", "--config", str(config), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc, run, step, timeout=120.0) -> bool:
    """Wait until the run has logged `step`; False if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if last_logged_step(run) >= step:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    raise AssertionError(f"training did not reach step {step} in {timeout} s")


# --- non-finite losses and gradients -------------------------------------------------------


def tiny_batch():
    return collate([[5, 6, 7, 3], [8, 9, 3]], [[5, 6, 3], [7, 3]])


def optimizer_state(optimizer):
    return {(i, k): v.clone() for i, s in enumerate(optimizer.state.values()) for k, v in s.items()}


@pytest.mark.parametrize("fault", ["nan_loss", "inf_gradient"])
def test_a_non_finite_update_leaves_parameters_and_adam_state_untouched(fault, monkeypatch):
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), 20)
    cfg = Config()
    cfg.train.warmup_steps = 1
    optimizer = make_optimizer(model, cfg)
    fp32 = train_step_module.Precision.choose(torch.device("cpu"), "fp32")

    def step(n):
        return train_step(model, optimizer, [tiny_batch()], cfg, n, fp32)

    assert not step(1).skipped
    params = {k: v.clone() for k, v in model.state_dict().items()}
    state = optimizer_state(optimizer)

    if fault == "nan_loss":
        real = train_step_module.output_loss
        monkeypatch.setattr(
            train_step_module,
            "output_loss",
            lambda *a: tuple(x * math.nan for x in real(*a)),
        )
        hook = None
    else:
        hook = model.embed.weight.register_hook(lambda g: g * math.inf)
    stats = step(2)
    assert stats.skipped
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, params[k], rtol=0, atol=0, msg=k)
    for k, v in optimizer_state(optimizer).items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0, msg=str(k))
    assert all(p.grad is None for p in model.parameters())

    monkeypatch.undo()
    if hook is not None:
        hook.remove()
    assert not step(2).skipped  # the next good update applies, as Adam's second step
    assert any(not torch.equal(v, params[k]) for k, v in model.state_dict().items())
    assert all(int(s["step"]) == 2 for s in optimizer.state.values())


def nan_on_updates(monkeypatch, bad: set[int]):
    """Make the training loss NaN on the given calls (counted from 1; validation not counted)."""
    real, calls = train_step_module.output_loss, [0]

    def loss(*args):
        out = real(*args)
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] in bad or "all" in bad:
                return tuple(x * math.nan for x in out)
        return out

    monkeypatch.setattr(train_step_module, "output_loss", loss)


def test_a_few_non_finite_updates_are_skipped_and_logged(tmp_path, prepared, monkeypatch):
    nan_on_updates(monkeypatch, {3, 4, 9})
    run = tmp_path / "r"
    train(run_config(run, prepared, "train.max_steps=12", "train.log_every=4"), log=quiet)
    logged = records(run, "train")
    assert [r["skipped"] for r in logged] == [2, 0, 1]
    assert all(math.isfinite(r["loss"]) for r in logged)
    assert last(run).step == 12
    assert all(torch.isfinite(v).all() for v in last(run).model.values())


def test_non_finite_updates_in_a_row_stop_the_run_with_advice(tmp_path, prepared, monkeypatch):
    nan_on_updates(monkeypatch, {"all"})
    cfg = run_config(tmp_path / "r", prepared, "train.max_steps=50", "train.max_nonfinite=4")
    with pytest.raises(MtxError, match=r"4 updates in a row .* learning rate .*lr_scale"):
        train(cfg, log=quiet)
    logged = records(tmp_path / "r", "train")
    assert logged[0]["skipped"] == 2 and logged[0]["loss"] is None


# --- out of memory ----------------------------------------------------------------------------


def oom_on_updates(monkeypatch, bad: set[int]):
    real, calls = Transformer.forward, [0]

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] in bad or "all" in bad:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", forward)


def test_an_out_of_memory_batch_is_skipped_and_training_goes_on(tmp_path, prepared, monkeypatch):
    oom_on_updates(monkeypatch, {2, 5})
    run = tmp_path / "r"
    train(run_config(run, prepared, "train.max_steps=6"), log=quiet)
    assert [r["step"] for r in records(run, "oom")] == [1, 3]
    assert last(run).step == 6


def test_repeated_out_of_memory_stops_and_suggests_smaller_batches(tmp_path, prepared, monkeypatch):
    oom_on_updates(monkeypatch, {"all"})
    cfg = run_config(tmp_path / "r", prepared, "train.max_steps=6", "train.update_freq=2")
    with pytest.raises(MtxError, match=r"3 batches in a row: lower train.max_tokens \(now 512\)"):
        train(cfg, log=quiet)


# --- signals and kill -9 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_a_stop_signal_saves_a_checkpoint_exits_0_and_says_how_to_resume(
    tmp_path, uninterrupted, signum
):
    run = tmp_path / "r"
    run_config(run, uninterrupted / "prepared")
    proc = start_training(run)
    assert wait_for_step(proc, run, 15)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    hint = f"mtx train --config {run / 'config.yaml'} --resume"
    assert f"stopped by {signum.name}" in err and hint in err
    assert 15 <= last(run).step < 80
    # the suggested command continues the run to the same end as an uninterrupted one
    train(load_config(run / "config.yaml"), resume=True, log=quiet)
    same_runs(uninterrupted, run)


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_ends_like_an_uninterrupted_run(
    tmp_path, uninterrupted
):
    run = tmp_path / "r"
    run_config(run, uninterrupted / "prepared")
    rng = random.Random(5)
    target, kills = 0, 0
    while True:
        proc = start_training(run, "--resume")
        if kills < 3:
            target += rng.randint(4, 25)
            if wait_for_step(proc, run, target):
                time.sleep(rng.uniform(0.0, 0.05))  # sometimes in the middle of a save
                proc.kill()
                proc.wait()
                kills += 1
                continue
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        break
    assert kills == 3
    same_runs(uninterrupted, run)
    same_runs(uninterrupted, run, "best.pt")
    steps = [r["step"] for r in records(run, "train")]
    assert steps == [r["step"] for r in records(uninterrupted, "train")]
    assert not list(run.rglob("*.tmp"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "best.pt",
        "last.pt",
        "step-70.pt",
        "step-80.pt",
    ]


# --- damaged checkpoints ----------------------------------------------------------------------


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(tmp_path, uninterrupted):
    run = tmp_path / "r"
    train(run_config(run, uninterrupted / "prepared", *FAULT_RUN, "train.max_steps=30"), log=quiet)
    for name in ("last.pt", "step-30.pt"):
        path = run / "checkpoints" / name
        path.write_bytes(path.read_bytes()[:1000])
    said = []
    train(run_config(run, uninterrupted / "prepared", *FAULT_RUN), resume=True, log=said.append)
    assert any("last.pt: not a loadable mtx checkpoint" in s for s in said)
    assert any("resuming from" in s and "step-20.pt at step 20" in s for s in said)
    same_runs(uninterrupted, run)


def test_resume_with_no_loadable_checkpoint_is_a_clear_error(tmp_path, prepared):
    run = tmp_path / "r"
    train(run_config(run, prepared, *FAULT_RUN, "train.max_steps=10"), log=quiet)
    for path in (run / "checkpoints").glob("*.pt"):
        path.write_bytes(b"garbage")
    with pytest.raises(MtxError, match="no loadable checkpoint to resume from"):
        train(run_config(run, prepared, *FAULT_RUN), resume=True, log=quiet)


def test_resume_without_checkpoints_starts_from_scratch(tmp_path, prepared):
    run = tmp_path / "r"
    said = []
    train(run_config(run, prepared, "train.max_steps=4"), resume=True, log=said.append)
    assert any("starting from step 0" in s for s in said)
    assert last(run).step == 4


def test_resume_on_data_prepared_again_with_another_vocabulary_is_refused(tmp_path, prepared):
    run = tmp_path / "r"
    train(run_config(run, prepared, "train.max_steps=4"), log=quiet)
    ckpt = last(run)
    ckpt.spm_model += b"\x00"
    ckpt.save(run / "checkpoints" / "last.pt")
    with pytest.raises(MtxError, match="last.pt was trained with another SentencePiece vocabulary"):
        train(run_config(run, prepared, "train.max_steps=8"), resume=True, log=quiet)


def test_an_interrupted_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"the previous file")

    def crash(f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, crash)
    assert path.read_bytes() == b"the previous file"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_resume_removes_what_a_killed_write_left_behind(tmp_path, prepared):
    run = tmp_path / "r"
    train(run_config(run, prepared, "train.max_steps=4"), log=quiet)
    (run / "checkpoints" / ".last.pt.x1y2.tmp").write_bytes(b"half")
    (run / ".config.yaml.z3.tmp").write_bytes(b"half")
    said = []
    train(run_config(run, prepared, "train.max_steps=6"), resume=True, log=said.append)
    assert sum("left by an interrupted write" in s for s in said) == 2
    assert not list(run.rglob("*.tmp"))
    assert last(run).step == 6


def test_an_interrupted_prepare_leaves_nothing_that_train_accepts(tmp_path, monkeypatch):
    from mtx.data import prepare

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare.vocab, "train_bpe", interrupted)
    config = Path(__file__).resolve().parents[1] / "configs" / "toy.yaml"
    args = ["--config", str(config), "--set", f"run_dir={tmp_path}"]
    result = invoke("prepare", *args)
    assert result.exit_code == 130 and "mtx: interrupted" in result.output
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "prepared.tmp").exists()
    (tmp_path / "prepared.tmp" / "train").mkdir(parents=True)  # as a kill -9 would leave it
    result = invoke("train", *args)
    assert result.exit_code == 2 and "run `mtx prepare`" in result.output
