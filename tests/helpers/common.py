"""What many tests do: run the CLI, write a corpus, read a run's metrics and checkpoints, and
check that two runs ended with the same parameters."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from typer.testing import CliRunner

from mtx.checkpoint import Checkpoint, RunDir
from mtx.cli import app
from mtx.train.metrics import read_metrics


def invoke(*args, input=None):
    """`mtx ARGS` in this process (Typer's runner): the result, whatever its exit code."""
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def mtx(*args, input=None):
    """`mtx ARGS` that must succeed; its result."""
    result = invoke(*args, input=input)
    assert result.exit_code == 0, result.output + str(result.exception or "")
    return result


def write_pair(prefix: Path, src: list[str], tgt: list[str], newline: str = "\n",
               langs: tuple[str, str] = ("en", "de")) -> None:  # fmt: skip
    """A parallel corpus: PREFIX.en and PREFIX.de (bytes as given, each line + `newline`)."""
    for lang, lines in zip(langs, (src, tgt)):
        (prefix.parent / f"{prefix.name}.{lang}").write_bytes(
            "".join(line + newline for line in lines).encode("utf-8")
        )


def records(run: Path, kind: str | None = None) -> list[dict]:
    """The complete records of a run's metrics.jsonl (of `kind` if given); a line that a
    running job is still writing is left out."""
    return read_metrics(RunDir(run).metrics, kind)


def last(run: Path) -> Checkpoint:
    """The run's last.pt."""
    return Checkpoint.load(RunDir(run).last)


def assert_same_parameters(a: Path, b: Path) -> None:
    """Two checkpoint files hold the same step and bit-identical weights, and, where both are
    resumable, bit-identical Adam moments for every weight."""
    x, y = Checkpoint.load(a), Checkpoint.load(b)
    assert x.step == y.step
    assert x.model.keys() == y.model.keys()
    different = [k for k in x.model if not torch.equal(x.model[k], y.model[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"
    if x.resume is None or y.resume is None:
        return
    states = x.resume.optimizer["state"], y.resume.optimizer["state"]
    assert len(states[0]) == len(states[1]) == len(x.model)  # Adam state for every weight
    for p, q in zip(states[0].values(), states[1].values()):
        assert all(torch.equal(p[k], q[k]) for k in p)


def perturbed(source: Path, out: Path, scale: float, seed: int = 3) -> Path:
    """A checkpoint of `source`'s model with noise (`scale` times each tensor's deviation)
    added to its weights: a draft (decode.draft) that agrees with it often, not always."""
    ckpt = Checkpoint.load(source)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, w in ckpt.model.items():
        if w.is_floating_point() and w.numel() > 1:
            w = w + scale * w.std() * torch.randn(w.shape, generator=g)
        weights[name] = w
    dataclasses.replace(ckpt, model=weights, resume=None).save(out)
    return out
