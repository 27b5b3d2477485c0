"""Self-describing checkpoints: weights plus everything needed to use or resume them.

A checkpoint is a dict saved with `torch.save` and read with `weights_only=True` (no code in a
checkpoint ever runs). It holds the resolved config, the SentencePiece model, the data
manifest (what `mtx prepare` read and kept, with hashes) and the mtx version (so `translate`,
`evaluate`, `export` and `info` need nothing but the checkpoint), and, for resuming, the
optimizer state, the step, the position in the data order and the RNG state. Files are written atomically: a
temporary file, fsync, rename.

A run's checkpoints directory holds `last.pt` (resumable), `best.pt` (weights of the best
validation by train.best_metric: lowest loss or highest BLEU) and the last `train.keep_last` step checkpoints `step-N.pt` (resumable, and
what `average()` reads). How a run writes and resumes them: mtx/train/resume.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtx import __version__
from mtx.config import Config, apply_overrides, from_dict
from mtx.errors import MtxError
from mtx.files import atomic_write
from mtx.model.build import Model, make_model

FORMAT = "mtx-checkpoint-1"


def save(path: Path, payload: dict[str, Any]) -> None:
    payload = payload | {"format": FORMAT, "mtx_version": __version__}
    atomic_write(path, lambda f: torch.save(payload, f))


def step_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step}.pt"


def step_checkpoints(directory: Path) -> list[Path]:
    """The step-N.pt files in `directory`, newest (highest N) first."""
    found = []
    for path in directory.glob("step-*.pt"):
        match = re.fullmatch(r"step-(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest `keep` step checkpoints."""
    for path in step_checkpoints(directory)[keep:]:
        path.unlink(missing_ok=True)


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MtxError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MtxError(f"{path}: not a loadable mtx checkpoint ({first[:200]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise MtxError(f"{path}: not an mtx checkpoint (format {FORMAT} expected)")
    return ckpt


def load_model(path: str | Path, overrides: list[str] | None = None) -> tuple[Model, Config, bytes]:
    """The model (eval mode, on CPU), its config with `overrides` applied, and its SentencePiece model."""
    return build_model(load(path), path, overrides)


def load_config(path: str | Path, overrides: list[str] | None = None) -> tuple[Config, bytes]:
    """A checkpoint's config with `overrides` applied, and its SentencePiece model: what
    `load_model` gives but the model (its weights are read, then dropped)."""
    ckpt = load(path)
    return apply_overrides(from_dict(ckpt["config"]), overrides).validate(), ckpt["spm_model"]


def build_model(
    ckpt: dict[str, Any], path: str | Path, overrides: list[str] | None = None
) -> tuple[Model, Config, bytes]:
    """`load_model` of a checkpoint already loaded from `path`."""
    cfg = apply_overrides(from_dict(ckpt["config"]), overrides).validate()
    model = make_model(cfg.model, ckpt["vocab_size"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError:
        raise MtxError(
            f"{path}: its weights do not fit the model config (were model.* keys overridden?)"
        ) from None
    return model.eval(), cfg, ckpt["spm_model"]


def last_step_checkpoints(run: Path, n: int) -> list[Path]:
    """The `n` newest step-N.pt of a run directory (or of its checkpoints directory)."""
    directory = run / "checkpoints" if (run / "checkpoints").is_dir() else run
    found = step_checkpoints(directory)
    if not found:
        raise MtxError(f"no step-N.pt checkpoints in {directory}")
    if len(found) < n:
        raise MtxError(
            f"--last {n} asks for more checkpoints than {directory} holds ({len(found)}; "
            "train.keep_last sets how many a run keeps)"
        )
    return found[:n]


def average(paths: list[Path]) -> dict[str, Any]:
    """A weights-only checkpoint whose parameters are the mean of those of `paths` (the
    paper's checkpoint averaging, section 6.1). Checkpoints are read one at a time (memory
    holds one plus the float64 sums). They must share the model config and the vocabulary;
    config, vocabulary and data manifest are taken from the newest (highest step)."""
    if not paths:
        raise MtxError("no checkpoints to average")
    sums: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    first: dict[str, Any] = {}
    newest: dict[str, Any] = {}
    sources = []
    for path in paths:
        ckpt = load(path)
        weights = ckpt.pop("model")
        meta = {k: ckpt.get(k) for k in ("config", "spm_model", "vocab_size", "manifest", "step")}
        del ckpt  # optimizer state and the like
        if not first:
            first = meta
            sums = {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}
            dtypes = {k: v.dtype for k, v in weights.items()}
        else:
            if meta["config"]["model"] != first["config"]["model"] or weights.keys() != sums.keys():
                raise MtxError(f"{path}: another model than {paths[0]}; cannot average")
            if (meta["spm_model"], meta["vocab_size"]) != (first["spm_model"], first["vocab_size"]):
                raise MtxError(f"{path}: another vocabulary than {paths[0]}; cannot average")
            for name, tensor in weights.items():
                if tensor.is_floating_point():
                    sums[name] += tensor.double()
                elif not torch.equal(tensor, sums[name]):
                    raise MtxError(f"{path}: {name} differs and is not a float; cannot average")
        if not newest or (meta["step"] or 0) > (newest["step"] or 0):
            newest = meta
        sources.append({"path": str(path), "step": meta["step"]})
    model = {
        k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v for k, v in sums.items()
    }
    return {**newest, "model": model, "averaged_from": sources}
