"""`train.init_from`: a new run that starts from a trained model's weights (fine-tuning).

- The checkpoint is read on rank 0 and sent to every process (`Dist.decide`).
- The `model.*` keys the config leaves out come from the checkpoint; a key it gives must
  match the checkpoint's, except those that shape training only (dropout, attention_dropout,
  init), which a fine-tuning run may change.
- `train.init_parts` takes some parts only (`[embeddings, encoder]`: a student on its
  teacher's encoder); the others start from the run's own initialisation, and the keys that
  shape only them (`PART_KEYS`) may differ from the checkpoint's.
- The prepared data must be encoded with the checkpoint's SentencePiece model (`mtx prepare`
  with `data.spm_model: CKPT`); data encoded with another model is refused.
- By default only the weights are taken: a fresh Adam, step 0 and the run's own learning-rate
  schedule. `train.init_keep_optimizer` keeps the Adam moments (last.pt and step-N.pt hold
  them, best.pt does not) and `train.init_keep_step` the step count, so that the learning rate
  goes on from where it was (`train.max_steps` then counts from the checkpoint's step).
- The run's checkpoints record where it started (`InitRecord`: path, sha256, step, what was
  kept), and `mtx info` shows it. `--resume` continues from the run's own checkpoints, exactly
  as any run (the checkpoint named here is read again only for its `model.*` keys).

Each function takes the parts it reads or changes, never the trainer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from mtx.checkpoint import Checkpoint, InitRecord
from mtx.config import PARTS, Config, ModelConfig, TrainConfig
from mtx.distributed import Dist
from mtx.errors import MtxError
from mtx.files import sha256_file
from mtx.train.state import TrainState

TRAINING_ONLY = ("dropout", "attention_dropout", "init")
# the model.* keys that shape one part only: free to differ when train.init_parts leaves it out
PART_KEYS = {
    "encoder": ("encoder_layers",),
    "decoder": ("decoder_layers", "decoder_d_ff", "decoder_self"),
}


@dataclass
class Start:
    """The checkpoint a fine-tuning run starts from, and its file."""

    ckpt: Checkpoint
    file: str  # its resolved path
    sha256: str  # of its file


def read(cfg: Config, dist: Dist) -> Start:
    """The checkpoint `train.init_from` names, with its file's sha256, read by rank 0."""
    path = Path(cfg.train.init_from)

    def load() -> Start:
        return Start(Checkpoint.load(path), str(path.resolve()), sha256_file(path))

    start = dist.decide(load)
    if cfg.train.init_keep_optimizer and start.ckpt.resume is None:
        raise MtxError(
            f"train.init_keep_optimizer: {path} holds no optimizer state (best.pt never "
            "does): start from last.pt or a step-N.pt, or leave the optimizer fresh"
        )
    return start


def take_model_config(cfg: Config, start: Start) -> None:
    """Fill the `model.*` keys the config left out from the checkpoint; refuse a given key
    that differs from the checkpoint's, naming it."""
    theirs = start.ckpt.settings().model
    free = TRAINING_ONLY + tuple(
        key for part, keys in PART_KEYS.items() if part not in cfg.train.init_parts for key in keys
    )
    for f in dataclasses.fields(ModelConfig):
        key, mine, other = f"model.{f.name}", getattr(cfg.model, f.name), getattr(theirs, f.name)
        if cfg.given is not None and key not in cfg.given:
            setattr(cfg.model, f.name, other)
        elif mine != other and f.name not in free:
            raise MtxError(
                f"train.init_from {cfg.train.init_from}: {key} is {mine!r} in the config but "
                f"{other!r} in the checkpoint; leave {key} out of the config to take the "
                "checkpoint's"
            )
    cfg.validate()


def load_weights(
    model: torch.nn.Module, start: Start, spm_proto: bytes, prepared: Path, t: TrainConfig
) -> InitRecord:
    """The checkpoint's weights into `model`, once its vocabulary is checked against that of
    the `prepared` data (`spm_proto`); returns what the run's checkpoints record of it."""
    ckpt, path = start.ckpt, t.init_from
    if ckpt.spm_model != spm_proto:
        mine = hashlib.sha256(spm_proto).hexdigest()[:12]
        theirs = hashlib.sha256(ckpt.spm_model).hexdigest()[:12]
        raise MtxError(
            f"train.init_from {path}: its SentencePiece model (sha256 {theirs}...) is not the "
            f"one the data in {prepared} was encoded with ({mine}...): prepare the data with "
            f"data.spm_model={path}"
        )
    try:
        _load_parts(model, ckpt.model, t.init_parts)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()[:200]
        raise MtxError(
            f"train.init_from {path}: its weights do not fit the model ({first})"
        ) from None
    kept = [name for name, keep in (("optimizer", t.init_keep_optimizer),
                                    ("step", t.init_keep_step)) if keep]  # fmt: skip
    return InitRecord(start.file, start.sha256, ckpt.step, kept, list(t.init_parts))


def _load_parts(model: torch.nn.Module, weights: dict, parts: list[str]) -> None:
    """Every weight (`parts` all of PARTS), or those of `parts` only: each of them must be in
    `weights` with its shape, and `weights` must hold no other of theirs."""
    if set(parts) == set(PARTS):
        model.load_state_dict(weights)
        return
    prefixes = tuple(prefix for part in parts for prefix in model.PARTS[part])
    taken = {name: w for name, w in weights.items() if name.startswith(prefixes)}
    mine = {name for name in model.state_dict() if name.startswith(prefixes)}
    for name in sorted(mine ^ taken.keys()):
        where = "the checkpoint" if name in mine else "the model"
        raise RuntimeError(f"{name} is not in {where}")
    model.load_state_dict(taken, strict=False)  # a shape that differs still raises


def load_optimizer(
    optimizer: torch.optim.Optimizer, state: TrainState, start: Start, t: TrainConfig
) -> None:
    """train.init_keep_optimizer and train.init_keep_step, on a fresh optimizer and state."""
    if t.init_keep_optimizer:
        optimizer.load_state_dict(start.ckpt.resume.optimizer)
        for group in optimizer.param_groups:  # this run's settings, not the old run's
            group["betas"], group["eps"] = (t.adam_beta1, t.adam_beta2), t.adam_eps
    if t.init_keep_step:
        state.step = start.ckpt.step
