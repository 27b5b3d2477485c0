"""`train.init_from`: a new run that starts from a trained model's weights (fine-tuning).

- The checkpoint is read on rank 0 and sent to every process (`Dist.decide`).
- The `model.*` keys the config leaves out come from the checkpoint; a key it gives must
  match the checkpoint's, except those that shape training only (dropout, attention_dropout,
  init), which a fine-tuning run may change.
- The prepared data must be encoded with the checkpoint's SentencePiece model (`mtx prepare`
  with `data.spm_model: CKPT`); data encoded with another model is refused.
- By default only the weights are taken: a fresh Adam, step 0 and the run's own learning-rate
  schedule. `train.init_keep_optimizer` keeps the Adam moments (last.pt and step-N.pt hold
  them, best.pt does not) and `train.init_keep_step` the step count, so that the learning rate
  goes on from where it was (`train.max_steps` then counts from the checkpoint's step).
- The run's checkpoints record where it started (`init_from`: path, sha256, step, what was
  kept), and `mtx info` shows it. `--resume` continues from the run's own checkpoints, exactly
  as any run (the checkpoint named here is read again only for its `model.*` keys).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtx import checkpoint
from mtx.config import Config, ModelConfig, from_dict
from mtx.errors import MtxError

if TYPE_CHECKING:
    from mtx.train.distributed import Dist
    from mtx.train.trainer import Trainer

TRAINING_ONLY = ("dropout", "attention_dropout", "init")


def read(cfg: Config, dist: Dist) -> dict[str, Any]:
    """The checkpoint `train.init_from` names, with its file's sha256, read by rank 0."""
    path = Path(cfg.train.init_from)

    def load() -> dict[str, Any]:
        ckpt = checkpoint.load(path)
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return ckpt | {"file_sha256": digest.hexdigest(), "file": str(path.resolve())}

    ckpt = dist.decide(load)
    if cfg.train.init_keep_optimizer and "optimizer" not in ckpt:
        raise MtxError(
            f"train.init_keep_optimizer: {path} holds no optimizer state (best.pt never "
            "does): start from last.pt or a step-N.pt, or leave the optimizer fresh"
        )
    return ckpt


def take_model_config(cfg: Config, ckpt: dict[str, Any]) -> None:
    """Fill the `model.*` keys the config left out from the checkpoint; refuse a given key
    that differs from the checkpoint's, naming it."""
    given = getattr(cfg, "given", None)  # None: every key was given
    theirs = from_dict({"model": ckpt["config"]["model"]}).model
    for f in dataclasses.fields(ModelConfig):
        key, mine, other = f"model.{f.name}", getattr(cfg.model, f.name), getattr(theirs, f.name)
        if given is not None and key not in given:
            setattr(cfg.model, f.name, other)
        elif mine != other and f.name not in TRAINING_ONLY:
            raise MtxError(
                f"train.init_from {cfg.train.init_from}: {key} is {mine!r} in the config but "
                f"{other!r} in the checkpoint; leave {key} out of the config to take the "
                "checkpoint's"
            )
    cfg.validate()


def load_weights(trainer: Trainer, ckpt: dict[str, Any]) -> None:
    """The checkpoint's weights into the trainer's model, once its vocabulary is checked
    against the prepared data's."""
    t, path = trainer, trainer.cfg.train.init_from
    if ckpt["spm_model"] != t.spm_proto:
        mine = hashlib.sha256(t.spm_proto).hexdigest()[:12]
        theirs = hashlib.sha256(ckpt["spm_model"]).hexdigest()[:12]
        raise MtxError(
            f"train.init_from {path}: its SentencePiece model (sha256 {theirs}...) is not the "
            f"one the data in {t.run_dir / 'prepared'} was encoded with ({mine}...): prepare "
            f"the data with data.spm_model={path}"
        )
    try:
        t.model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()[:200]
        raise MtxError(
            f"train.init_from {path}: its weights do not fit the model ({first})"
        ) from None
    kept = [name for name, keep in (("optimizer", t.cfg.train.init_keep_optimizer),
                                    ("step", t.cfg.train.init_keep_step)) if keep]  # fmt: skip
    t.init_record = {
        "path": ckpt["file"],
        "sha256": ckpt["file_sha256"],
        "step": ckpt.get("step"),
        "kept": kept,
    }


def load_optimizer(trainer: Trainer, ckpt: dict[str, Any]) -> None:
    """train.init_keep_optimizer and train.init_keep_step, on the trainer's fresh optimizer
    and state (after `load_weights`)."""
    t = trainer.cfg.train
    if t.init_keep_optimizer:
        trainer.optimizer.load_state_dict(ckpt["optimizer"])
        for group in trainer.optimizer.param_groups:  # this run's settings, not the old run's
            group["betas"], group["eps"] = (t.adam_beta1, t.adam_beta2), t.adam_eps
    if t.init_keep_step:
        trainer.state.step = ckpt["step"]
