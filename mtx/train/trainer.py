"""`mtx train`: the training loop; the step, validation and checkpointing are what it calls.

One update (`train_step`) consumes `update_freq` token-budget batches on each process,
normalises the summed label-smoothed loss by the number of target tokens of the whole update,
clips the gradient norm if asked, and sets the learning rate from the paper's schedule. The
loss is read back from the device only when logging, so the step has no host-device
synchronisation. Under torchrun (distributed.py) each process takes its own share of every
update's batches, and N processes train exactly as one process with N times the update_freq.

Faults lose nothing: an update with a non-finite loss or gradient is skipped on the device
(the fused Adam step is told `found_inf`) and counted; a batch that runs out of GPU memory is
skipped; SIGTERM/SIGINT save a resumable checkpoint at the next step boundary and end the run
cleanly. Too many of either fault in a row stop the run with advice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from mtx.config import Config
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.data.prepare import load_manifest, load_prepared, load_spm_proto, prepared_dir
from mtx.errors import MtxError
from mtx.files import atomic_write_text, remove_stale_temporaries
from mtx.model.build import make_model
from mtx.model.transformer import PAD_ID, count_parameters
from mtx.train import checkpoint
from mtx.train.distributed import Dist
from mtx.train.loss import label_smoothed_nll
from mtx.train.schedule import rate


@dataclass
class TrainState:
    step: int = 0  # updates done
    epoch: int = 0  # current pass over the data
    batch: int = 0  # batches of the current epoch already consumed
    best_valid_loss: float = math.inf


def pick_device(name: str) -> torch.device:
    """The device a config names; under torchrun, CUDA means this process's GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MtxError(f"train.device is {name!r} but no CUDA device is available")
    if name.startswith("cuda") and "WORLD_SIZE" in os.environ:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


@dataclass
class Precision:
    """How a step computes: autocast to `dtype` (None: plain fp32), and for fp16 the dynamic
    loss scaler that keeps small gradients from underflowing."""

    device: torch.device
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    @classmethod
    def choose(cls, device: torch.device, name: str) -> Precision:
        """bf16 autocast on GPUs that support it for "auto", else what `name` says."""
        if name == "auto":
            cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
            name = "bf16" if cuda_bf16 else "fp32"
        if name == "bf16":
            return cls(device, torch.bfloat16)
        if name == "fp16":
            return cls(device, torch.float16, torch.amp.GradScaler(device.type))
        return cls(device)

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


def make_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Adam:
    """Adam as in the paper; fused, so that a non-finite update is skipped on the device."""
    return torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
        eps=cfg.train.adam_eps,
        fused=True,
    )


def forward_loss(model, batch: dict, cfg: Config, precision: Precision) -> tuple:
    """Summed label-smoothed loss and NLL of a batch (still on the host when passed in); the
    output projection runs only at target tokens, and a source without padding goes unmasked."""
    src_padded = bool((batch["src"] == PAD_ID).any())  # read on the host: no device sync
    b = {k: v.to(precision.device, non_blocking=True) for k, v in batch.items()}
    with precision.autocast():
        logits = model(b["src"], b["tgt_in"], b["tgt_index"], src_padded)  # (N, V)
    target = b["tgt_out"].flatten()[b["tgt_index"]]  # (N,)
    return label_smoothed_nll(logits, target, cfg.train.label_smoothing, PAD_ID)


def train_step(
    model,
    optimizer,
    batches: list[dict],
    cfg: Config,
    step: int,
    precision: Precision,
    ntokens: int | None = None,
    world: int = 1,
) -> dict:
    """One update from `batches`; returns device tensors (summed losses, whether the update was
    skipped for a non-finite loss or gradient) and host token counts.

    `ntokens` is the number of target tokens of the whole update, all processes together
    (default: those of `batches`). DistributedDataParallel averages gradients over the `world`
    processes, so each scales its loss by world / ntokens: the sum is the gradient of the
    update's per-token loss, as one process with all the batches would compute it.
    """
    lr = rate(step, cfg.model.d_model, cfg.train.warmup_steps, cfg.train.lr_scale)
    for group in optimizer.param_groups:
        group["lr"] = lr
    local_tokens = sum(len(b["tgt_index"]) for b in batches)  # counted on the host
    factor = world / (ntokens or local_tokens)
    scaler = precision.scaler
    loss_sum = nll_sum = torch.zeros((), device=precision.device)
    for i, b in enumerate(batches):
        # Gradients are averaged across processes once, on the update's last batch.
        last = i == len(batches) - 1
        accumulate = model.no_sync() if hasattr(model, "no_sync") and not last else None
        with accumulate or contextlib.nullcontext():
            loss, nll = forward_loss(model, b, cfg, precision)
            (scaler.scale(loss * factor) if scaler else loss * factor).backward()
        loss_sum, nll_sum = loss_sum + loss.detach(), nll_sum + nll.detach()
    if scaler:
        scaler.unscale_(optimizer)  # records inf/NaN for the scaler's update() below
    if cfg.train.clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm(
            [p.grad for p in model.parameters() if p.grad is not None]
        )
    finite = torch.isfinite(norm)  # the same on every process: gradients are already averaged
    if world == 1:
        finite = finite & torch.isfinite(loss_sum)
    skipped = ~finite
    # The fused Adam kernels read `found_inf` on the device and leave parameters, moments and
    # step count untouched when it is 1 (the mechanism torch.amp.GradScaler uses): no sync.
    optimizer.found_inf = skipped.float()
    optimizer.step()
    if scaler:
        scaler.update()  # halve the scale after an overflow, grow it after a long calm
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": torch.where(skipped, 0.0, loss_sum),
        "nll": torch.where(skipped, 0.0, nll_sum),
        "skipped": skipped,
        "tgt_tokens": local_tokens,
        "src_tokens": sum(int((b["src"] != PAD_ID).sum()) for b in batches),
        "padded_tokens": sum(b["src"].numel() + b["tgt_out"].numel() for b in batches),
        "lr": lr,
    }


@torch.no_grad()
def validate(model, valid_ds, cfg: Config, precision: Precision, dist: Dist) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on the validation split (each
    process takes every world-th batch; the sums are added up across processes)."""
    model.eval()
    batches = token_batches(*lengths(valid_ds), cfg.train.max_tokens)[dist.rank :: dist.world]
    loss_sum = nll_sum = torch.zeros((), device=precision.device, dtype=torch.float64)
    ntokens = 0
    for b in BatchDataset(valid_ds, batches):
        ntokens += len(b["tgt_index"])
        loss, nll = forward_loss(model, b, cfg, precision)
        loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
    model.train()
    loss_sum, nll_sum, ntokens = dist.sum(
        [loss_sum.item(), nll_sum.item(), float(ntokens)], precision.device
    )
    nll = nll_sum / max(ntokens, 1)
    return {
        "valid_loss": loss_sum / max(ntokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 100.0)),
    }


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl (path None: writes nothing, for
    the processes other than the main one)."""

    def __init__(self, path: Path | None) -> None:
        self.file = open(path, "a", encoding="utf-8") if path else None

    def write(self, **record) -> None:
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


class Trainer:
    """A run: its data, model, optimizer and position, and the loop that advances them."""

    def __init__(self, cfg: Config, log=print) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.device = pick_device(cfg.train.device)
        self.dist = Dist.from_env(self.device)
        self.log = log if self.dist.main else (lambda *_: None)
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        self.precision = Precision.choose(self.device, cfg.train.precision)
        self.train_ds, self.valid_ds = load_prepared(cfg, "train"), load_prepared(cfg, "valid")
        self.train_tgt_lens = lengths(self.train_ds)[1]
        self.spm_proto = load_spm_proto(cfg)
        self.manifest = load_manifest(cfg)
        self.vocab_size = self.manifest["vocab_size"]
        torch.manual_seed(cfg.train.seed)  # the same initial model on every process
        self.model = make_model(cfg.model, self.vocab_size).to(self.device)
        if self.dist.rank:
            torch.manual_seed(cfg.train.seed + self.dist.rank)  # but its own dropout
        self.train_model: torch.nn.Module = self.model  # what the step runs: wrapped, compiled
        if self.dist.enabled:
            self.train_model = torch.nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )
        if cfg.train.compile:
            self.train_model = torch.compile(self.train_model, dynamic=True)
        self.optimizer = make_optimizer(self.model, cfg)
        self.state = TrainState()
        self.window = Window(self.device)
        self.stop_signal: str | None = None  # set by SIGTERM/SIGINT; acted on between steps
        self.ooms_in_a_row = 0
        self.saved_step = -1

    @property
    def group(self) -> int:
        """Batches per update, all processes together."""
        return self.dist.world * self.cfg.train.update_freq

    def batches(self) -> tuple[torch.utils.data.DataLoader, list[int]]:
        """This process's share of the rest of the current epoch's batches, in the order fixed
        by (seed, epoch), and the target tokens of each update (all processes together).

        The epoch's batches are taken in groups of `group`, one group an update, process r
        taking the r-th update_freq of them; a last group too small for an update is left out.
        """
        cfg, U, G = self.cfg.train, self.cfg.train.update_freq, self.group
        order = token_batches(*lengths(self.train_ds), cfg.max_tokens, cfg.seed, self.state.epoch)
        usable = len(order) - len(order) % G
        if usable == 0:
            raise MtxError(
                f"the training data makes {len(order)} batches of train.max_tokens "
                f"({cfg.max_tokens}) tokens, fewer than one update takes ({G}: "
                f"{self.dist.world} process(es) x train.update_freq {U}); lower "
                "train.update_freq or train.max_tokens"
            )
        mine, update_tokens = [], []
        r = self.dist.rank
        for g in range(self.state.batch, usable, G):
            mine += order[g + r * U : g + (r + 1) * U]
            update_tokens.append(int(sum(self.train_tgt_lens[b].sum() for b in order[g : g + G])))
        workers = cfg.workers
        loader = torch.utils.data.DataLoader(
            BatchDataset(self.train_ds, mine),
            batch_size=None,
            num_workers=workers,
            prefetch_factor=4 if workers else None,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator(),  # keeps the global RNG (dropout) untouched by loaders
        )
        return loader, update_tokens

    def run(self) -> dict[str, float]:
        """Train until train.max_steps, train.max_minutes or a stop signal; returns the last
        validation (empty if the run was stopped before validating)."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.main:
            atomic_write_text(
                self.run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False)
            )
        params = count_parameters(self.model)
        where = f"{self.dist.world} processes, " if self.dist.enabled else ""
        self.log(
            f"model: {params:,} parameters, vocabulary {self.vocab_size}, {where}device "
            f"{self.device}, {self.precision.name}"
        )
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl" if self.dist.main else None)
        self.progress = tqdm(
            total=cfg.train.max_steps,
            initial=self.state.step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=None if self.dist.main else True,
            mininterval=1.0,
        )
        start = time.monotonic()
        try:
            with self.stop_signals():
                result = self.loop(start)
        finally:
            self.progress.close()
            self.metrics.close()
        minutes = (time.monotonic() - start) / 60
        if self.stop_signal:
            self.log(
                f"stopped by {self.stop_signal} at step {self.state.step}; saved "
                f"{self.ckpt_dir / 'last.pt'}. Resume with: "
                f"mtx train --config {self.run_dir / 'config.yaml'} --resume"
            )
        else:
            self.log(
                f"trained {self.state.step} steps in {minutes:.1f} min; "
                f"checkpoints in {self.ckpt_dir}"
            )
        return result

    def loop(self, start: float) -> dict[str, float]:
        cfg, state = self.cfg, self.state
        result: dict[str, float] = {}
        finished = state.step >= cfg.train.max_steps
        self.model.train()
        while not finished:
            loader, update_tokens = self.batches()
            tokens = iter(update_tokens)
            pending: list = []
            for batch in loader:
                pending.append(batch)
                if len(pending) < cfg.train.update_freq:
                    continue
                stats = self.update(pending, next(tokens))
                pending = []
                state.batch += self.group
                if stats is None:  # out of memory: the batches were skipped
                    continue
                state.step += 1
                self.progress.update(1)
                self.window.add(stats)
                if state.step % cfg.train.log_every == 0:
                    self.log_train(self.window.flush(state.step, stats["lr"], self.dist))
                time_up, stop = self.should_stop(start)
                finished = state.step >= cfg.train.max_steps or time_up
                if state.step % cfg.train.valid_every == 0 or finished:
                    result = self.validate_and_save()
                if stop:
                    if self.saved_step != state.step:
                        self.save(is_best=False)
                    return result
                if finished:
                    break
            else:
                state.epoch, state.batch = state.epoch + 1, 0
        if not (self.ckpt_dir / "best.pt").is_file():  # resumed a finished run
            result = self.validate_and_save()
        return result

    def should_stop(self, start: float) -> tuple[bool, bool]:
        """(time is up, a stop signal came). Processes must agree on both, so under torchrun
        they compare notes, at log and validation steps only (a collective costs a sync)."""
        time_up = time.monotonic() - start >= (self.cfg.train.max_minutes * 60 or math.inf)
        stop = self.stop_signal is not None
        if self.dist.enabled:
            step, t = self.state.step, self.cfg.train
            if step % t.log_every and step % t.valid_every and step < t.max_steps:
                return False, False
            time_up, stop = self.dist.any([time_up, stop], self.device)
            if stop and not self.stop_signal:
                self.stop_signal = "a stop signal to another process"
        return time_up, stop

    def update(self, batches: list, ntokens: int) -> dict | None:
        """train_step, or None when the batches ran out of GPU memory and were skipped."""
        try:
            stats = train_step(
                self.train_model,
                self.optimizer,
                batches,
                self.cfg,
                self.state.step + 1,
                self.precision,
                ntokens,
                self.dist.world,
            )
            self.ooms_in_a_row = 0
            return stats
        except torch.OutOfMemoryError:
            if self.dist.enabled:  # the other processes are inside the step: cannot skip alone
                raise MtxError(
                    f"process {self.dist.rank} ran out of memory at step "
                    f"{self.state.step + 1}: lower train.max_tokens (now "
                    f"{self.cfg.train.max_tokens}) and raise train.update_freq to keep the "
                    "same batch size, then resume"
                ) from None
        # recover outside the except block, where the failed step's tensors are freed
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.ooms_in_a_row += 1
        tokens = sum(int(b["src"].numel() + b["tgt_in"].numel()) for b in batches)
        self.metrics.write(kind="oom", step=self.state.step, tokens=tokens)
        self.say(
            f"step {self.state.step + 1}: out of memory on {len(batches)} batch(es) of "
            f"{tokens} padded tokens; skipped them"
        )
        if self.ooms_in_a_row >= self.cfg.train.max_oom:
            raise MtxError(
                f"out of memory on {self.ooms_in_a_row} batches in a row: lower "
                f"train.max_tokens (now {self.cfg.train.max_tokens}) and raise "
                f"train.update_freq to keep the same batch size"
            )
        return None

    @contextlib.contextmanager
    def stop_signals(self):
        """While training, SIGTERM and SIGINT ask for a checkpoint and a clean stop at the next
        step boundary; a second signal acts as it normally would."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum, frame):  # only sets a flag: the loop acts on it between steps
            self.stop_signal = signal.Signals(signum).name
            signal.signal(signum, previous[signum])

        for s in previous:
            signal.signal(s, handler)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def say(self, message: str) -> None:
        if self.dist.main:
            self.progress.write(message)

    def log_train(self, record: dict) -> None:
        self.metrics.write(kind="train", **record)
        if record["skipped"]:
            self.say(
                f"step {record['step']}: {record['skipped']} update(s) skipped since the last "
                "log line (non-finite loss or gradient)"
            )
        self.check_nonfinite()
        self.progress.set_postfix(
            loss="skipped" if record["loss"] is None else f"{record['loss']:.3f}",
            lr=f"{record['lr']:.2e}",
            tok_s=f"{record['tokens_per_s']:.0f}",
        )

    def check_nonfinite(self) -> None:
        """Stop when train.max_nonfinite updates in a row were skipped."""
        worst = self.window.worst_streak()
        if worst >= self.cfg.train.max_nonfinite:
            raise MtxError(
                f"{worst} updates in a row had a non-finite loss or gradient (up to step "
                f"{self.state.step}; they were skipped): most likely the learning rate is too "
                "high (lower train.lr_scale or raise train.warmup_steps); resume from "
                f"{self.ckpt_dir / 'last.pt'} once changed"
            )

    def validate_and_save(self) -> dict[str, float]:
        self.check_nonfinite()
        result = validate(self.model, self.valid_ds, self.cfg, self.precision, self.dist)
        is_best = result["valid_loss"] < self.state.best_valid_loss
        if is_best:
            self.state.best_valid_loss = result["valid_loss"]
        self.save(is_best)
        self.metrics.write(kind="valid", step=self.state.step, best=is_best, **result)
        self.say(
            f"step {self.state.step}: valid loss {result['valid_loss']:.3f}, "
            f"ppl {result['valid_ppl']:.2f}" + (" (best)" if is_best else "")
        )
        return result

    def save(self, is_best: bool) -> None:
        """best.pt (weights) if best, then step-N.pt and last.pt (resumable: optimizer, loss
        scale, data position, RNG of every process). In this order a crash between two writes
        leaves a consistent run: resuming from the older last.pt replays the steps and
        rewrites the newer files. Only the main process writes; all must call this."""
        cuda = torch.cuda.is_available()
        rngs = self.dist.gather(
            (torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else [])
        )
        self.saved_step = self.state.step
        if not self.dist.main:
            return
        common = {
            "config": self.cfg.to_dict(),
            "spm_model": self.spm_proto,
            "vocab_size": self.vocab_size,
            "manifest": self.manifest,
            "model": self.model.state_dict(),
            "step": self.state.step,
            "best_valid_loss": self.state.best_valid_loss,
        }
        scaler = self.precision.scaler
        resume = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler else None,
            "epoch": self.state.epoch,
            "batch": self.state.batch,
            "rng": rngs[0][0],
            "cuda_rng": rngs[0][1],
            "process_rngs": rngs,  # (CPU, CUDA) RNG states of each torchrun process
        }
        if is_best:
            checkpoint.save(self.ckpt_dir / "best.pt", common)
        if self.cfg.train.keep_last > 0:
            checkpoint.save(checkpoint.step_path(self.ckpt_dir, self.state.step), common | resume)
            checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last)
        checkpoint.save(self.ckpt_dir / "last.pt", common | resume)

    def prepare_run_dir(self, resume: bool, overwrite: bool) -> None:
        """A run directory that already holds checkpoints is never silently overwritten:
        resume it, or say `overwrite` to delete its checkpoints and metrics and start again."""
        old = [self.ckpt_dir, self.run_dir / "metrics.jsonl"]
        if not resume and any(p.exists() for p in old):
            if not overwrite:
                raise MtxError(
                    f"{self.run_dir} already holds a training run: pass --resume to continue "
                    "it, --overwrite to start again, or choose another run_dir"
                )
            self.dist.barrier()  # every process has looked before the main one deletes
            if self.dist.main:
                shutil.rmtree(old[0], ignore_errors=True)
                old[1].unlink(missing_ok=True)
        if resume:
            self.restore()
        self.dist.barrier()

    def restore(self) -> None:
        """Continue from the newest loadable checkpoint, or start afresh if there is none."""
        if self.dist.main:
            stale = remove_stale_temporaries(self.ckpt_dir)
            stale += remove_stale_temporaries(self.run_dir)
            for path in stale:
                self.log(f"removed {path}, left by an interrupted write")
        self.dist.barrier()
        found = checkpoint.load_resumable(self.ckpt_dir, self.log)
        if found is None:
            self.log(f"no checkpoint in {self.ckpt_dir}: starting from step 0")
            if self.dist.main:
                truncate_metrics(self.run_dir / "metrics.jsonl", 0)
            return
        path, ckpt = found
        if ckpt["spm_model"] != self.spm_proto or ckpt["vocab_size"] != self.vocab_size:
            raise MtxError(
                f"{path} was trained with another SentencePiece vocabulary than "
                f"{prepared_dir(self.cfg)}: the data was prepared again since; train a new "
                "run_dir or pass --overwrite"
            )
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError):
            raise MtxError(
                f"{path}: its weights do not fit the model config (were model.* keys changed?)"
            ) from None
        scaler = self.precision.scaler
        if scaler and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        rngs = ckpt.get("process_rngs") or [(ckpt["rng"], ckpt["cuda_rng"])]
        if len(rngs) == self.dist.world:
            cpu_rng, cuda_rng = rngs[self.dist.rank]
            torch.set_rng_state(cpu_rng)
            if cuda_rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(cuda_rng)
        else:  # another number of processes than before: fresh dropout streams
            torch.manual_seed(self.cfg.train.seed + 1000 * ckpt["step"] + self.dist.rank)
        self.state = TrainState(ckpt["step"], ckpt["epoch"], ckpt["batch"], ckpt["best_valid_loss"])
        if self.dist.main:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.state.step)
        self.log(f"resuming from {path} at step {ckpt['step']}")


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the complete metrics records up to `step`: a resumed run rewrites what follows."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if line.endswith("\n") and record.get("step", 0) <= step:
            kept.append(line)
    atomic_write_text(path, "".join(kept))


class Window:
    """Loss and token sums since the last log line, kept on the device until read."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.streak = torch.zeros((), dtype=torch.long, device=device)  # skipped in a row
        self.reset()

    def reset(self) -> None:
        zero = torch.zeros((), device=self.device)
        self.loss = self.nll = self.good_tgt_tokens = zero
        self.skipped = torch.zeros((), dtype=torch.long, device=self.device)
        self.worst = self.streak.clone()
        self.tgt_tokens = self.src_tokens = self.padded_tokens = 0
        self.t = time.monotonic()

    def add(self, stats: dict) -> None:
        skipped = stats["skipped"].long()
        self.loss, self.nll = self.loss + stats["loss"], self.nll + stats["nll"]
        self.good_tgt_tokens = self.good_tgt_tokens + (1 - skipped) * stats["tgt_tokens"]
        self.skipped = self.skipped + skipped
        self.streak = (self.streak + 1) * skipped
        self.worst = torch.maximum(self.worst, self.streak)
        self.tgt_tokens += stats["tgt_tokens"]
        self.src_tokens += stats["src_tokens"]
        self.padded_tokens += stats["padded_tokens"]

    def worst_streak(self) -> int:
        return int(self.worst)  # the same on every process: skipping is decided together

    def flush(self, step: int, lr: float, dist: Dist) -> dict:
        """The window's record, summed over all processes, and a fresh window."""
        elapsed = max(time.monotonic() - self.t, 1e-9)
        loss, nll, good, skipped = torch.stack(
            [self.loss, self.nll, self.good_tgt_tokens, self.skipped.float()]
        ).tolist()  # the only host-device synchronisation
        skipped = int(skipped)
        loss, nll, good, tgt, src, padded = dist.sum(
            [loss, nll, good, self.tgt_tokens, self.src_tokens, self.padded_tokens], self.device
        )
        nll = nll / good if good else None  # None (JSON null): every update was skipped
        record = {
            "step": step,
            "loss": loss / good if good else None,
            "nll": nll,
            "ppl": math.exp(min(nll, 100.0)) if good else None,
            "lr": lr,
            "tokens_per_s": (tgt + src) / elapsed,
            "tgt_tokens_per_s": tgt / elapsed,
            "padding": 1 - (tgt + src) / padded if padded else 0.0,
            "skipped": skipped,
        }
        self.reset()
        return record


def train(
    cfg: Config, resume: bool = False, overwrite: bool = False, log=print
) -> dict[str, float]:
    """`mtx train`: train on RUN/prepared, from scratch or from the run's newest checkpoint;
    one process, or one of those torchrun started."""
    trainer = Trainer(cfg, log)
    try:
        trainer.prepare_run_dir(resume, overwrite)
        return trainer.run()
    finally:
        trainer.dist.close()
