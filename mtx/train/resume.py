"""A run's checkpoints: what training writes into them and how a run continues from one.

Only the main process (rank 0) touches the run directory: it decides whether the directory may
be used (`prepare_run_dir`), writes the checkpoints (`save_checkpoints`), finds and reads the
newest one that loads (`restore`) and sends its contents to the other processes, which need
nothing on disk but the prepared data. So a job whose machines have their own disks resumes as
one on a shared disk does, and rank 1's disk never holds a checkpoint.

Each function takes the parts it reads or changes (`StatefulParts`: the model, the optimizer,
the loss scaler, the train state, each with `state_dict`/`load_state_dict`), never the
trainer. (Not config.PARTS, the parts of a model that train.freeze names.) A
resumable checkpoint holds the model, the optimizer, the loss scale, the run's position and
the RNG state of every process; resuming on the same number of processes continues exactly
where the run was (bit-identical on CPU).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mtx.checkpoint import Checkpoint, Resume, RunDir
from mtx.distributed import Dist
from mtx.errors import MtxError
from mtx.files import remove_stale_temporaries
from mtx.train.ema import Ema
from mtx.train.metrics import truncate_metrics
from mtx.train.state import TrainState


@dataclass
class StatefulParts:
    """The stateful parts of a run that its checkpoints save and restore, each with
    `state_dict`/`load_state_dict` (a part added here is saved and restored by `save` and
    `load` below, and nowhere else)."""

    model: torch.nn.Module  # the bare model (not DDP's or the compiler's wrapper)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # fp16's loss scaler; None for other precisions
    state: TrainState  # the run's position and the bookkeeping of validations
    ema: Ema | None = None  # train.ema's moving average of the weights

    def save(self, header: Checkpoint, rngs: list) -> tuple[Checkpoint, Checkpoint]:
        """(the weights-only checkpoint, the resumable one) of the parts as they are now;
        `header` holds what every checkpoint of the run shares, `rngs` every process's RNG
        state. With train.ema the weights are the average, and the resumable checkpoint keeps
        the trained ones beside them."""
        trained = self.model.state_dict()
        model = self.ema.weights(self.model) if self.ema else trained
        weights = dataclasses.replace(header, model=model, position=self.state.state_dict())
        scaler = self.scaler.state_dict() if self.scaler else None
        raw = trained if self.ema else None
        resume = Resume(self.optimizer.state_dict(), scaler, rngs, raw)
        return weights, dataclasses.replace(weights, resume=resume)

    def load(self, path: str, ckpt: Checkpoint) -> None:
        """Every part from a resumable checkpoint (`path` names it in the error). A checkpoint
        written without train.ema, resumed with it, starts the average at its weights; one
        written with it, resumed without, continues from the trained weights."""
        raw = ckpt.resume.raw_model
        try:
            self.model.load_state_dict(raw if raw is not None else ckpt.model)
            if self.ema:
                self.ema.load_state_dict(ckpt.model)
            self.optimizer.load_state_dict(ckpt.resume.optimizer)
        except (RuntimeError, ValueError, KeyError):
            raise MtxError(
                f"{path}: its weights do not fit the model config (were model.* keys changed?)"
            ) from None
        if self.scaler and ckpt.resume.scaler:
            self.scaler.load_state_dict(ckpt.resume.scaler)
        self.state.load_state_dict(ckpt.position)


def prepare_run_dir(
    run: RunDir, dist: Dist, resume: bool, overwrite: bool, log: Callable[[str], None]
) -> None:
    """A run directory that already holds checkpoints is never silently overwritten: resume
    it, or say `overwrite` to delete its checkpoints and metrics and start again. Rank 0 looks
    and acts; every process gets its verdict."""

    def check() -> None:  # rank 0 alone
        old = [run.checkpoints, run.metrics, run.tensorboard]
        if not resume and any(p.exists() for p in old):
            if not overwrite:
                raise MtxError(
                    f"{run.root} already holds a training run: pass --resume to continue "
                    "it, --overwrite to start again, or choose another run_dir"
                )
            shutil.rmtree(run.checkpoints, ignore_errors=True)
            run.metrics.unlink(missing_ok=True)
            shutil.rmtree(run.tensorboard, ignore_errors=True)
        if resume:
            stale = remove_stale_temporaries(run.checkpoints) + remove_stale_temporaries(run.root)
            for path in stale:
                log(f"removed {path}, left by an interrupted write")

    dist.decide(check)


def load_resumable(run: RunDir, log: Callable[[str], None]) -> tuple[Path, Checkpoint] | None:
    """The newest checkpoint of the run that loads and can be resumed, or None if there is no
    checkpoint at all. Unloadable ones are skipped, saying why."""
    problems = []
    for path in [run.last, *run.steps()]:
        if not path.is_file():
            continue
        try:
            ckpt = Checkpoint.load(path)
        except MtxError as e:
            problems.append(str(e))
            log(f"warning: {e}; trying an older checkpoint")
            continue
        if ckpt.resume is not None:
            return path, ckpt
    if problems:
        raise MtxError(f"no loadable checkpoint to resume from in {run.checkpoints}: {problems[0]}")
    return None


def restore(
    run: RunDir,
    dist: Dist,
    header: Checkpoint,
    parts: StatefulParts,
    seed: int,
    log: Callable[[str], None],
) -> Checkpoint | None:
    """Continue from the newest loadable checkpoint on rank 0's disk: each of `parts` as it
    was, and this process's RNG state; returns it (None: there is none, the run starts
    afresh). Rank 0 reads it and sends it to every process; `header` says which vocabulary it
    must have."""

    def find() -> tuple[str, Checkpoint] | None:  # rank 0 alone
        found = load_resumable(run, log)
        if found is None:
            return None
        path, ckpt = found
        if ckpt.spm_model != header.spm_model or ckpt.vocab_size != header.vocab_size:
            raise MtxError(
                f"{path} was trained with another SentencePiece vocabulary than "
                f"{run.prepared}: the data was prepared again since; train a new run_dir or "
                "pass --overwrite"
            )
        return str(path), ckpt

    found = dist.decide(find)
    if found is None:
        log(f"no checkpoint in {run.checkpoints}: starting from step 0")
        if dist.main:
            truncate_metrics(run.metrics, 0)
        return None
    path, ckpt = found
    parts.load(path, ckpt)
    _restore_rngs(ckpt, dist, seed)
    if dist.main:
        truncate_metrics(run.metrics, parts.state.step)
    log(f"resuming from {path} at step {parts.state.step}")
    return ckpt


def _restore_rngs(ckpt: Checkpoint, dist: Dist, seed: int) -> None:
    """This process's RNG state as it was; on another number of processes than before, fresh
    dropout streams."""
    rngs = ckpt.resume.process_rngs
    if len(rngs) == dist.world:
        cpu_rng, cuda_rng = rngs[dist.rank]
        torch.set_rng_state(cpu_rng)
        if cuda_rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda_rng)
    else:
        torch.manual_seed(seed + 1000 * ckpt.step + dist.rank)


def save_checkpoints(
    run: RunDir, dist: Dist, header: Checkpoint, parts: StatefulParts, is_best: bool, keep_last: int
) -> None:
    """best.pt (weights) if best, then step-N.pt and last.pt (resumable: optimizer, loss
    scale, data position, RNG of every process). In this order a crash between two writes
    leaves a consistent run: resuming from the older last.pt replays the steps and rewrites
    the newer files. Every process must call this (the RNG states are gathered); only the
    main process writes. `header` holds what every checkpoint of the run shares."""
    cuda = torch.cuda.is_available()
    rngs = dist.gather((torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else []))
    if not dist.main:
        return
    weights, resumable = parts.save(header, rngs)
    if is_best:
        weights.save(run.best)
    if keep_last > 0:
        resumable.save(run.step(parts.state.step))
        run.prune(keep_last)
    resumable.save(run.last)
