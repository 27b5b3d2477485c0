import json
import math

import pytest
import torch
from conftest import run_config, tiny_model_config
from helpers.common import last, records

from mtx.checkpoint import Checkpoint, RunDir
from mtx.config import Config, load_config
from mtx.data.batching import collate
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.train.step import Precision, make_optimizer, train_step
from mtx.train.trainer import train


def params(run):
    return last(run).model


def test_resume_ends_with_the_same_parameters_as_an_uninterrupted_run(tmp_path, prepared):
    quiet = {"log": lambda *_: None}
    # 60 updates of 2 batches of 4096 tokens cross epoch boundaries; resume lands mid-epoch
    big = ["train.max_tokens=4096", "train.update_freq=2"]
    train(run_config(tmp_path / "whole", prepared, "train.max_steps=60", *big), **quiet)
    train(run_config(tmp_path / "parts", prepared, "train.max_steps=25", *big), **quiet)
    assert last(tmp_path / "parts").step == 25
    with pytest.raises(MtxError, match="--resume to continue it, --overwrite"):
        train(run_config(tmp_path / "parts", prepared, "train.max_steps=60", *big), **quiet)
    train(
        run_config(tmp_path / "parts", prepared, "train.max_steps=60", *big), resume=True, **quiet
    )
    whole, parts = params(tmp_path / "whole"), params(tmp_path / "parts")
    assert whole.keys() == parts.keys()
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=0, atol=0, msg=name)
    assert last(tmp_path / "parts").position.epoch >= 1


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
    assert last(tmp_path / "r").step == 2
    train(
        run_config(tmp_path / "r", prepared, "train.max_steps=100000", "train.max_minutes=0.0001"),
        overwrite=True,
        log=lambda *_: None,
    )
    best = Checkpoint.load(RunDir(tmp_path / "r").best)
    assert 1 <= last(tmp_path / "r").step < 100
    assert best.settings().model.d_model == 32 and isinstance(best.spm_model, bytes)
    assert best.resume is None


def losses(run, kind="train", key="loss"):
    return [r[key] for r in records(run, kind)]


def test_fp16_trains_with_a_loss_scale_and_resumes_exactly(tmp_path, prepared):
    """fp16 autocast with dynamic loss scaling (on CPU here; on GPUs without bf16 in use).
    The scale is part of the resumable state: interrupted and resumed equals uninterrupted."""
    quiet = {"log": lambda *_: None}
    # warm-up over the run: at TINY_RUN's 4000 the 30 updates would barely move the loss
    fp16 = ["train.precision=fp16", "train.valid_every=10", "train.warmup_steps=30"]
    train(run_config(tmp_path / "whole", prepared, "train.max_steps=30", *fp16), **quiet)
    first = losses(tmp_path / "whole")
    assert all(math.isfinite(x) for x in first) and first[-1] < first[0]
    assert last(tmp_path / "whole").resume.scaler["scale"] > 0
    train(run_config(tmp_path / "parts", prepared, "train.max_steps=10", *fp16), **quiet)
    train(
        run_config(tmp_path / "parts", prepared, "train.max_steps=30", *fp16), resume=True, **quiet
    )
    whole, parts = params(tmp_path / "whole"), params(tmp_path / "parts")
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    "settings",
    [["train.precision=bf16-weights"], ["train.static_shapes=true"]],
    ids=["bf16-weights", "static-shapes"],
)
def test_bf16_weights_and_static_shapes_train_and_resume_exactly(tmp_path, prepared, settings):
    """Interrupted and resumed equals uninterrupted; bf16-weights' checkpoints hold the fp32
    master weights."""
    quiet = {"log": lambda *_: None}
    both = [*settings, "train.valid_every=10", "train.warmup_steps=30"]
    train(run_config(tmp_path / "whole", prepared, "train.max_steps=30", *both), **quiet)
    first = losses(tmp_path / "whole")
    assert all(math.isfinite(x) for x in first) and first[-1] < first[0]
    train(run_config(tmp_path / "parts", prepared, "train.max_steps=10", *both), **quiet)
    train(
        run_config(tmp_path / "parts", prepared, "train.max_steps=30", *both), resume=True, **quiet
    )
    whole, parts = params(tmp_path / "whole"), params(tmp_path / "parts")
    for name in whole:
        assert whole[name].dtype == torch.float32, name
        torch.testing.assert_close(parts[name], whole[name], rtol=0, atol=0, msg=name)


def test_an_fp16_overflow_halves_the_loss_scale_and_skips_the_update():
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(), 20)
    cfg = Config()
    optimizer = make_optimizer(model, cfg)
    fp16 = Precision.choose(torch.device("cpu"), "fp16")
    batch = collate([[5, 6, 7, 3], [8, 9, 3]], [[5, 6, 3], [7, 3]])
    assert not train_step(model, optimizer, [batch], cfg, 1, fp16).skipped
    scale = fp16.scaler.get_scale()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hook = model.embed.weight.register_hook(lambda g: g * math.inf)
    assert train_step(model, optimizer, [batch], cfg, 2, fp16).skipped
    hook.remove()
    assert fp16.scaler.get_scale() == scale / 2
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)


def test_background_workers_build_the_same_batches(tmp_path, prepared):
    quiet = {"log": lambda *_: None}
    for workers in (0, 2):
        cfg = run_config(tmp_path / f"w{workers}", prepared, "train.max_steps=12")
        cfg.train.workers = workers
        train(cfg, **quiet)
    a, b = params(tmp_path / "w0"), params(tmp_path / "w2")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    assert losses(tmp_path / "w0") == losses(tmp_path / "w2")
    padding = losses(tmp_path / "w2", key="padding")
    assert all(0.0 < p < 0.5 for p in padding)  # token batches of similar lengths pad little


@pytest.mark.slow  # train.compile over a run (off on the CPU; test_compiled.py checks the compiled step)
def test_compiled_training_follows_eager_training(tmp_path, prepared):
    quiet = {"log": lambda *_: None}
    extra = ["train.max_steps=6", "model.dropout=0.0"]
    train(run_config(tmp_path / "eager", prepared, *extra), **quiet)
    train(run_config(tmp_path / "compiled", prepared, *extra, "train.compile=true"), **quiet)
    a, b = params(tmp_path / "eager"), params(tmp_path / "compiled")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-4, msg=name)


def test_an_update_larger_than_the_data_is_a_clear_error(tmp_path, prepared):
    cfg = run_config(tmp_path / "r", prepared, "train.update_freq=100000")
    with pytest.raises(MtxError, match=r"fewer than one update takes \(100000: 1 process"):
        train(cfg, log=lambda *_: None)


def test_logged_tokens_per_second_leave_validation_time_out(tmp_path, prepared, monkeypatch):
    """A validation that took a billion seconds (on a shifted clock) does not lower the
    tokens/s of the window it falls in: the rate is the training's alone."""
    import time as real_time
    import types

    from mtx.train import metrics, trainer

    shift = [0.0]
    clock = types.SimpleNamespace(monotonic=lambda: real_time.monotonic() + shift[0])
    monkeypatch.setattr(trainer, "time", clock)
    monkeypatch.setattr(metrics, "time", clock)
    validate_and_save = trainer.Trainer.validate_and_save

    def slow_validation(self, **kw):
        shift[0] += 1e9
        return validate_and_save(self, **kw)

    monkeypatch.setattr(trainer.Trainer, "validate_and_save", slow_validation)
    run = tmp_path / "r"
    steps = ["train.max_steps=12", "train.valid_every=3", "train.log_every=4"]
    train(run_config(run, prepared, *steps), log=lambda *_: None)
    rates = [r["tokens_per_s"] for r in records(run, "train")]
    assert len(rates) == 3 and shift[0] == 4e9  # each window holds a validation
    assert min(rates) > 1e-3  # a window timed with a validation in it: under 512 * 4 / 1e9


def test_the_saved_config_says_what_the_run_trained_on(tmp_path, prepared):
    """A run may train on data another config prepared (a student on distilled data): its
    config.yaml starts with the prepared data's sources, from their manifest, and still loads."""
    cfg = run_config(tmp_path / "r", prepared, "train.max_steps=1", "data.train=never/read")
    train(cfg, log=lambda *_: None)
    text = (tmp_path / "r" / "config.yaml").read_text()
    manifest = json.loads((prepared / "manifest.json").read_text())
    source = manifest["splits"]["train"]["source"]
    assert source != "never/read"
    assert (
        text.splitlines()[1]
        == f"#   train: {source} ({manifest['splits']['train']['kept']:,} pairs)"
    )
    assert load_config(tmp_path / "r" / "config.yaml").data.train == "never/read"
