"""A run's checkpoints: what the trainer writes into them and how a run continues from one.

Only the main process (rank 0) touches the run directory: it decides whether the directory may
be used (`prepare_run_dir`), writes the checkpoints (`save_checkpoints`), finds and reads the
newest one that loads (`restore`) and sends its contents to the other processes, which need
nothing on disk but the prepared data. So a job whose machines have their own disks resumes as one on a
shared disk does, and rank 1's disk never holds a checkpoint.

A resumable checkpoint holds the model, the optimizer, the loss scale, the step, the position
in the data order and the RNG state of every process; resuming on the same number of processes
continues exactly where the run was (bit-identical on CPU).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mtx import checkpoint
from mtx.data.prepare import prepared_dir
from mtx.errors import MtxError
from mtx.files import remove_stale_temporaries
from mtx.train.metrics import truncate_metrics

if TYPE_CHECKING:
    from mtx.train.trainer import Trainer


@dataclass
class TrainState:
    """The run's position, saved in every resumable checkpoint."""

    step: int = 0  # updates done
    epoch: int = 0  # current pass over the data
    batch: int = 0  # batches of the current epoch already consumed
    best_valid_loss: float = math.inf
    best_valid_bleu: float = -math.inf
    best_step: int = 0  # the step of the best validation by train.best_metric
    stale: int = 0  # validations since then that measured train.best_metric (train.patience)

    def observe(self, result: dict[str, float], metric: str) -> bool:
        """Note a validation's results; True if it is the best yet by `metric` (loss: the
        lowest valid_loss; bleu: the highest valid_bleu; a validation without BLEU does not
        count for bleu)."""
        better = {"loss": result["valid_loss"] < self.best_valid_loss}
        self.best_valid_loss = min(self.best_valid_loss, result["valid_loss"])
        if "valid_bleu" in result:
            better["bleu"] = result["valid_bleu"] > self.best_valid_bleu
            self.best_valid_bleu = max(self.best_valid_bleu, result["valid_bleu"])
        if metric not in better:
            return False
        if better[metric]:
            self.best_step, self.stale = self.step, 0
        else:
            self.stale += 1
        return better[metric]


def prepare_run_dir(trainer: Trainer, resume: bool, overwrite: bool) -> None:
    """A run directory that already holds checkpoints is never silently overwritten: resume
    it, or say `overwrite` to delete its checkpoints and metrics and start again. Rank 0 looks
    and acts; every process gets its verdict."""
    run_dir, ckpt_dir, log = trainer.run_dir, trainer.ckpt_dir, trainer.log

    def check() -> None:  # rank 0 alone
        old = [ckpt_dir, run_dir / "metrics.jsonl", run_dir / "tensorboard"]
        if not resume and any(p.exists() for p in old):
            if not overwrite:
                raise MtxError(
                    f"{run_dir} already holds a training run: pass --resume to continue "
                    "it, --overwrite to start again, or choose another run_dir"
                )
            shutil.rmtree(old[0], ignore_errors=True)
            old[1].unlink(missing_ok=True)
            shutil.rmtree(old[2], ignore_errors=True)
        if resume:
            for path in remove_stale_temporaries(ckpt_dir) + remove_stale_temporaries(run_dir):
                log(f"removed {path}, left by an interrupted write")

    trainer.dist.decide(check)
    if resume:
        restore(trainer)


def load_resumable(directory: Path, log: Callable[[str], None]) -> tuple[Path, dict] | None:
    """The newest checkpoint in `directory` that loads and holds optimizer state, or None if
    there is no checkpoint at all. Unloadable ones are skipped, saying why."""
    candidates = [directory / "last.pt", *checkpoint.step_checkpoints(directory)]
    problems = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            ckpt = checkpoint.load(path)
        except MtxError as e:
            problems.append(str(e))
            log(f"warning: {e}; trying an older checkpoint")
            continue
        if "optimizer" in ckpt:
            return path, ckpt
    if problems:
        raise MtxError(f"no loadable checkpoint to resume from in {directory}: {problems[0]}")
    return None


def restore(trainer: Trainer) -> None:
    """Continue from the newest loadable checkpoint on rank 0's disk, or start afresh if there
    is none. Rank 0 reads it and sends it to every process."""
    t = trainer

    def find() -> tuple[str, dict] | None:  # rank 0 alone
        found = load_resumable(t.ckpt_dir, t.log)
        if found is None:
            return None
        path, ckpt = found
        if ckpt["spm_model"] != t.spm_proto or ckpt["vocab_size"] != t.vocab_size:
            raise MtxError(
                f"{path} was trained with another SentencePiece vocabulary than "
                f"{prepared_dir(t.cfg)}: the data was prepared again since; train a new "
                "run_dir or pass --overwrite"
            )
        return str(path), ckpt

    found = t.dist.decide(find)
    if found is None:
        t.log(f"no checkpoint in {t.ckpt_dir}: starting from step 0")
        if t.dist.main:
            truncate_metrics(t.run_dir / "metrics.jsonl", 0)
        return
    path, ckpt = found
    try:
        t.model.load_state_dict(ckpt["model"])
        t.optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError):
        raise MtxError(
            f"{path}: its weights do not fit the model config (were model.* keys changed?)"
        ) from None
    scaler = t.precision.scaler
    if scaler and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    rngs = ckpt.get("process_rngs") or [(ckpt["rng"], ckpt["cuda_rng"])]
    if len(rngs) == t.dist.world:
        cpu_rng, cuda_rng = rngs[t.dist.rank]
        torch.set_rng_state(cpu_rng)
        if cuda_rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda_rng)
    else:  # another number of processes than before: fresh dropout streams
        torch.manual_seed(t.cfg.train.seed + 1000 * ckpt["step"] + t.dist.rank)
    t.init_record = ckpt.get("init_from")
    t.state = TrainState(
        ckpt["step"],
        ckpt["epoch"],
        ckpt["batch"],
        ckpt["best_valid_loss"],
        ckpt.get("best_valid_bleu", -math.inf),
        ckpt.get("best_step", 0),
        ckpt.get("stale_validations", 0),
    )
    if t.dist.main:
        truncate_metrics(t.run_dir / "metrics.jsonl", t.state.step)
    t.log(f"resuming from {path} at step {ckpt['step']}")


def save_checkpoints(trainer: Trainer, is_best: bool) -> None:
    """best.pt (weights) if best, then step-N.pt and last.pt (resumable: optimizer, loss
    scale, data position, RNG of every process). In this order a crash between two writes
    leaves a consistent run: resuming from the older last.pt replays the steps and rewrites
    the newer files. Every process must call this; only the main process writes."""
    t = trainer
    cuda = torch.cuda.is_available()
    rngs = t.dist.gather((torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else []))
    t.saved_step = t.state.step
    if not t.dist.main:
        return
    common = {
        "config": t.cfg.to_dict(),
        "spm_model": t.spm_proto,
        "vocab_size": t.vocab_size,
        "manifest": t.manifest,
        "model": t.model.state_dict(),
        "step": t.state.step,
        "best_valid_loss": t.state.best_valid_loss,
        "best_valid_bleu": t.state.best_valid_bleu,
        "best_step": t.state.best_step,
        "stale_validations": t.state.stale,
        "init_from": t.init_record,  # train.init_from: the checkpoint the run started from
    }
    scaler = t.precision.scaler
    resume = {
        "optimizer": t.optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler else None,
        "epoch": t.state.epoch,
        "batch": t.state.batch,
        "rng": rngs[0][0],
        "cuda_rng": rngs[0][1],
        "process_rngs": rngs,  # (CPU, CUDA) RNG states of each torchrun process
    }
    if is_best:
        checkpoint.save(t.ckpt_dir / "best.pt", common)
    if t.cfg.train.keep_last > 0:
        checkpoint.save(checkpoint.step_path(t.ckpt_dir, t.state.step), common | resume)
        checkpoint.prune(t.ckpt_dir, t.cfg.train.keep_last)
    checkpoint.save(t.ckpt_dir / "last.pt", common | resume)
