"""Self-describing checkpoints: weights plus everything needed to use or resume them.

A checkpoint is a dict saved with `torch.save` and read with `weights_only=True` (no code in a
checkpoint ever runs). It holds the resolved config, the SentencePiece model (so `translate`
and `evaluate` need nothing but the checkpoint), and, for resuming, the optimizer state, the
step, the position in the data order and the RNG state. Files are written atomically: a
temporary file, fsync, rename.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from mtx import __version__
from mtx.config import Config, apply_overrides, from_dict
from mtx.errors import MtxError
from mtx.model.transformer import Transformer

FORMAT = "mtx-checkpoint-1"


def save(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload | {"format": FORMAT, "mtx_version": __version__}, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def load_model(
    path: str | Path, overrides: list[str] | None = None
) -> tuple[Transformer, Config, bytes]:
    """The model (eval mode, on CPU), its config with `overrides` applied, and its SentencePiece model."""
    ckpt = load(path)
    cfg = apply_overrides(from_dict(ckpt["config"]), overrides).validate()
    model = Transformer(cfg.model, ckpt["vocab_size"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError:
        raise MtxError(
            f"{path}: its weights do not fit the model config (were model.* keys overridden?)"
        ) from None
    return model.eval(), cfg, ckpt["spm_model"]
