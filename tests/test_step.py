"""The training step (train/step.py), and the trainer's loop around it, never make the host
wait for the device between two log lines: counted with a TorchDispatchMode over 20
steady-state updates of the step, and over a real run's loop."""

import pytest
import torch
from conftest import TINY_RUN, run_config
from helpers.common import last
from torch.utils._python_dispatch import TorchDispatchMode

from mtx.config import load_config
from mtx.data.batching import collate
from mtx.model.build import make_model
from mtx.train import data as train_data
from mtx.train.metrics import Window
from mtx.train.step import LossModel, Precision, make_optimizer, train_step
from mtx.train.trainer import Trainer, train

# Operations that make the host wait: reading a value (.item(), .tolist(), bool(), int()), and
# outputs whose shape depends on the data.
WAITS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique"}
WAITS |= {"aten::_unique2", "aten::unique_consecutive", "aten::nonzero_static"}


class HostWaits(TorchDispatchMode):
    """Records every operation of WAITS, and indexing with boolean masks (a nonzero inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[str] = []
        self.paused = 0  # > 0: where waiting is allowed (a log line), nothing is recorded

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if self.paused:
            return func(*args, **(kwargs or {}))
        masks = name.startswith("aten::index") and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool
            for a in args
            if isinstance(a, (list, tuple))
            for t in a
        )
        if name in WAITS or masks:
            self.waits.append(name)
        return func(*args, **(kwargs or {}))


def batches(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(2, 20, (8, 2), generator=g).tolist()
        src = [torch.randint(4, 200, (s,), generator=g).tolist() + [3] for s, _ in lengths]
        tgt = [torch.randint(4, 200, (t,), generator=g).tolist() + [3] for _, t in lengths]
        out.append(collate(src, tgt, 8))
    return out


@pytest.mark.parametrize(
    "settings",
    [[], ["train.precision=fp16", "train.clip_norm=1.0", "train.update_freq=2"]],
    ids=["fp32", "fp16-clipped-accumulated"],
)
def test_twenty_updates_between_log_lines_never_wait_for_the_device(settings):
    cfg = load_config(None, [*TINY_RUN, *settings])
    torch.manual_seed(0)
    model = make_model(cfg.model, 200)
    step_module = LossModel(model, cfg.train.label_smoothing)
    optimizer = make_optimizer(model, cfg)
    precision = Precision.choose(torch.device("cpu"), cfg.train.precision)
    U = cfg.train.update_freq
    data = batches(21 * U)
    window = Window(torch.device("cpu"))
    updates = [data[i * U : (i + 1) * U] for i in range(21)]
    window.add(train_step(step_module, optimizer, updates[0], cfg, 1, precision))
    window.flush(1, 0.0, dist=_one_process())  # a log line: it may read the device once
    with HostWaits() as mode:
        for n, update in enumerate(updates[1:]):
            window.add(train_step(step_module, optimizer, update, cfg, n + 2, precision))
    assert mode.waits == []
    record = window.flush(21, 0.0, dist=_one_process())  # the next log line
    assert record.loss > 0 and record.skipped == 0


def test_the_counter_sees_what_waits():
    x = torch.randn(5)
    with HostWaits() as mode:
        x.sum().item()
        _ = x[x > 0]
        bool(x.max() > 0)
    assert mode.waits == ["aten::_local_scalar_dense", "aten::index", "aten::_local_scalar_dense"]


def _one_process():
    from mtx.distributed import Dist

    return Dist()


class Started:
    """A loader whose iterator is made where `allowed` says."""

    def __init__(self, loader, allowed) -> None:
        self.loader, self.allowed = loader, allowed

    def __iter__(self):
        return self.allowed(iter)(self.loader)


def test_the_training_loop_waits_for_the_device_only_to_log_and_validate(
    tmp_path, prepared, monkeypatch
):
    """A real run's loop (background workers building batches, the window of losses, the
    progress bar, the stop checks, epochs one after the other) over 60 updates, two epochs:
    nothing waits but the log lines, validation and checkpoints."""
    mode = HostWaits()

    def allowed(function):
        def run(*args, **kwargs):
            mode.paused += 1
            try:
                return function(*args, **kwargs)
            finally:
                mode.paused -= 1

        return run

    for cls, name in ((Trainer, "log_train"), (Trainer, "validate_and_save"), (Window, "flush")):
        monkeypatch.setattr(cls, name, allowed(getattr(cls, name)))
    # once a run, before the first update: the loader draws its workers' seed on the host
    # (a CPU tensor's .item(), no device involved)
    stream = train_data.stream
    monkeypatch.setattr(train_data, "stream", lambda *a: Started(stream(*a), allowed))
    loop = Trainer.loop

    def watched(self, start):
        with mode:
            return loop(self, start)

    monkeypatch.setattr(Trainer, "loop", watched)
    cfg = run_config(tmp_path / "run", prepared, "train.max_steps=60", "train.log_every=10",
                     "train.valid_every=30", "train.max_tokens=8192")  # fmt: skip
    train(cfg, log=lambda *_: None)
    assert last(tmp_path / "run").position.epoch >= 1  # the loop crossed an epoch
    assert mode.waits == []
    assert mode.paused == 0
