"""`mtx train`: the training loop, and the run it advances.

The loop (`Trainer.loop`) takes each process's share of every update's batches, calls the step
(step.py), logs (metrics.py), validates (validate.py) and checkpoints (resume.py). Under
torchrun (distributed.py) each process takes its own share of every update's batches, N
processes train exactly as one process with N times the update_freq, and every decision the
processes must take alike (whether to stop, whether a checkpoint exists) comes from rank 0 or
a collective.

Faults lose nothing: an update with a non-finite loss or gradient is skipped on the device
and counted; a batch that runs out of GPU memory is skipped; SIGTERM/SIGINT save a resumable
checkpoint at the next step boundary and end the run cleanly. Too many of either fault in a
row stop the run with advice. A process that dies or stops answering ends the job with an
error naming it, within train.dist_timeout seconds.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from mtx.config import Config
from mtx.data.batching import BatchDataset, lengths, token_batches
from mtx.data.prepare import load_manifest, load_prepared, load_spm_proto
from mtx.device import pick_device
from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.model.build import make_model
from mtx.model.transformer import count_parameters
from mtx.train import compiled
from mtx.train import init as init_from
from mtx.train.distributed import Dist, fingerprint
from mtx.train.metrics import MetricsLog, Window, summary_writer
from mtx.train.resume import TrainState, prepare_run_dir, save_checkpoints
from mtx.train.step import LossModel, Precision, make_optimizer, train_step
from mtx.train.validate import valid_bleu, validate


class Trainer:
    """A run: its data, model, optimizer and position, and the loop that advances them."""

    def __init__(self, cfg: Config, dist: Dist, log=print, init: dict | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.device = dist.device
        self.dist = dist
        self.log = log if dist.main else (lambda *_: None)
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        self.precision = Precision.choose(self.device, cfg.train.precision)
        self.train_ds, self.valid_ds = load_prepared(cfg, "train"), load_prepared(cfg, "valid")
        self.train_tgt_lens = lengths(self.train_ds)[1]
        self.spm_proto = load_spm_proto(cfg)
        self.manifest = load_manifest(cfg)
        dist.check_same_data(fingerprint(self.manifest, self.spm_proto))
        self.vocab_size = self.manifest["vocab_size"]
        torch.manual_seed(cfg.train.seed)  # the same initial model on every process
        self.model = make_model(cfg.model, self.vocab_size).to(self.device)
        self.init_record: dict | None = None  # train.init_from: where the run started (init.py)
        if init is not None:
            init_from.load_weights(self, init)
        self.frozen = self.model.freeze(cfg.train.freeze)  # before DDP sees what needs grads
        if dist.rank:
            torch.manual_seed(cfg.train.seed + dist.rank)  # but its own dropout
        step_module: torch.nn.Module = LossModel(self.model, cfg.train.label_smoothing)
        if dist.joined:
            step_module = torch.nn.parallel.DistributedDataParallel(
                step_module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )
        # what the step runs: the model and its loss, DDP-wrapped, compiled (compiled.py)
        self.step_module = compiled.StepModule(
            step_module,
            compiled.wanted(cfg.train.compile, self.device),
            self.say,
            cfg.train.compile_backend,
            cfg.train.compile_mode,
        )
        self.optimizer = make_optimizer(self.model, cfg)
        self.state = TrainState()
        if init is not None:
            init_from.load_optimizer(self, init)
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
        order = token_batches(
            *lengths(self.train_ds), cfg.max_tokens, cfg.seed, self.state.epoch, cfg.pad_to
        )
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
            BatchDataset(self.train_ds, mine, cfg.pad_to),
            batch_size=None,
            num_workers=workers,
            prefetch_factor=4 if workers else None,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator(),  # keeps the global RNG (dropout) untouched by loaders
            worker_init_fn=leave_stop_signals_to_the_trainer,
        )
        return loader, update_tokens

    def run(self) -> dict[str, float]:
        """Train until train.max_steps, train.max_minutes or a stop signal; returns the last
        validation (empty if the run was stopped before validating)."""
        cfg = self.cfg
        if cfg.train.tensorboard:
            summary_writer()  # a missing package fails before any work
        if self.dist.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(
                self.run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False)
            )
        params = count_parameters(self.model)
        where = f"{self.dist.world} process(es), {self.dist.backend}, " if self.dist.joined else ""
        self.log(
            f"model: {params:,} parameters, vocabulary {self.vocab_size}, {where}device "
            f"{self.device}, {self.precision.name}"
        )
        if self.init_record:
            r = self.init_record
            kept = f", keeping its {' and '.join(r['kept'])}" if r["kept"] else ""
            self.log(f"starting from {r['path']} (step {r['step']}){kept}")
        if self.frozen:
            self.log(f"frozen: {', '.join(cfg.train.freeze)} ({self.frozen:,} parameters)")
        tensorboard = self.run_dir / "tensorboard" if cfg.train.tensorboard else None
        self.metrics = MetricsLog(
            self.run_dir / "metrics.jsonl" if self.dist.main else None,
            tensorboard,
            self.state.step + 1 if self.state.step else 0,
        )
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
        self.log(self.ending((time.monotonic() - start) / 60))
        return result

    def ending(self, minutes: float) -> str:
        """The run's last line: why it stopped, and where its checkpoints are."""
        s, t = self.state, self.cfg.train
        if self.out_of_patience() and s.step < t.max_steps:
            best = (
                f"{s.best_valid_bleu:.2f}"
                if t.best_metric == "bleu"
                else f"{s.best_valid_loss:.3f}"
            )
            return (
                f"stopped early at step {s.step}: valid {t.best_metric} has not improved for "
                f"{s.stale} validations (train.patience {t.patience}); the best, {best} at "
                f"step {s.best_step}, is {self.ckpt_dir / 'best.pt'}"
            )
        if self.stop_signal:
            return (
                f"stopped by {self.stop_signal} at step {s.step}; saved "
                f"{self.ckpt_dir / 'last.pt'}. Resume with: "
                f"mtx train --config {self.run_dir / 'config.yaml'} --resume"
            )
        return f"trained {s.step} steps in {minutes:.1f} min; checkpoints in {self.ckpt_dir}"

    def loop(self, start: float) -> dict[str, float]:
        cfg, state = self.cfg, self.state
        result: dict[str, float] = {}
        finished = state.step >= cfg.train.max_steps or self.out_of_patience()
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
                    paused = time.monotonic()
                    result = self.validate_and_save(last=finished)
                    self.window.leave_out(time.monotonic() - paused)
                    finished = finished or self.out_of_patience()
                if stop:
                    if self.saved_step != state.step:
                        save_checkpoints(self, is_best=False)
                    return result
                if finished:
                    break
            else:
                state.epoch, state.batch = state.epoch + 1, 0
        # A resumed finished run: validate if no best.pt was written (rank 0's disk decides).
        if self.dist.decide(lambda: not (self.ckpt_dir / "best.pt").is_file()):
            result = self.validate_and_save(last=True)
        return result

    def out_of_patience(self) -> bool:
        """train.patience validations in a row did not improve train.best_metric (the same
        on every process: the metrics are)."""
        return 0 < self.cfg.train.patience <= self.state.stale

    def should_stop(self, start: float) -> tuple[bool, bool]:
        """(time is up, a stop signal came). Processes must agree on both, so under torchrun
        they compare notes at log and validation steps only (a collective costs a sync): time
        is rank 0's clock, a stop signal to any process stops all."""
        time_up = time.monotonic() - start >= (self.cfg.train.max_minutes * 60 or math.inf)
        stop = self.stop_signal is not None
        if self.dist.enabled:
            step, t = self.state.step, self.cfg.train
            if step % t.log_every and step % t.valid_every and step < t.max_steps:
                return False, False
            time_up, stop = self.dist.any([time_up and self.dist.main, stop])
            if stop and not self.stop_signal:
                self.stop_signal = "a stop signal to another process"
        return time_up, stop

    def update(self, batches: list, ntokens: int) -> dict | None:
        """train_step, or None when the batches ran out of GPU memory and were skipped."""
        args = (self.cfg, self.state.step + 1, self.precision, ntokens, self.dist.world)
        try:
            stats = self.step_module.run(
                lambda module: train_step(module, self.optimizer, batches, *args), self.optimizer
            )
            self.ooms_in_a_row = 0
            return stats
        except torch.OutOfMemoryError:
            if self.dist.joined:  # DDP's state (and the other processes) cannot skip alone
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
        if self.step_module.is_compiled:
            record |= compiled.stats()
        self.metrics.write(kind="train", **record)
        if record["skipped"]:
            self.say(
                f"step {record['step']}: {record['skipped']} update(s) skipped since the last "
                "log line (non-finite loss or gradient)"
            )
        self.check_nonfinite()
        compilations = {"compiles": record["compilations"]} if "compilations" in record else {}
        self.progress.set_postfix(
            loss="skipped" if record["loss"] is None else f"{record['loss']:.3f}",
            lr=f"{record['lr']:.2e}",
            tok_s=f"{record['tokens_per_s']:.0f}",
            **compilations,
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

    def validate_and_save(self, last: bool = False) -> dict[str, float]:
        """Validate (loss; BLEU and chrF every train.bleu_every validations and at the `last`),
        note the best, checkpoint, and report."""
        self.check_nonfinite()
        cfg, t = self.cfg, self.cfg.train
        start = time.monotonic()
        result = validate(self.model, self.valid_ds, cfg, self.precision, self.dist)
        number = self.state.step // t.valid_every  # validations so far, this one included
        if t.bleu_every and (last or number % t.bleu_every == 0):
            bleu_start = time.monotonic()
            args = (self.valid_ds, self.spm_proto, cfg, self.precision, self.dist)
            scores, hyps = valid_bleu(self.model, *args)
            result |= scores
            if self.dist.main:
                atomic_write_text(self.run_dir / "valid.hyp", "".join(h + "\n" for h in hyps))
            result["bleu_seconds"] = time.monotonic() - bleu_start
        result["valid_seconds"] = time.monotonic() - start
        is_best = self.state.observe(result, t.best_metric)
        save_checkpoints(self, is_best)
        self.metrics.write(kind="valid", step=self.state.step, best=is_best, **result)
        bleu = ""
        if "valid_bleu" in result:
            bleu = f", BLEU {result['valid_bleu']:.2f}, chrF {result['valid_chrf']:.2f}"
        self.say(
            f"step {self.state.step}: valid loss {result['valid_loss']:.3f}, "
            f"ppl {result['valid_ppl']:.2f}{bleu}" + (" (best)" if is_best else "")
        )
        return result


def leave_stop_signals_to_the_trainer(worker_id: int) -> None:
    """A batch-building process ignores SIGTERM and SIGINT: torchrun and a terminal send them to
    the whole process group, and the trainer, not its loader, decides when to stop (the loader
    ends its processes; they also exit when the trainer dies)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def train(
    cfg: Config, resume: bool = False, overwrite: bool = False, log=print
) -> dict[str, float]:
    """`mtx train`: train on RUN/prepared, from scratch or from the run's newest checkpoint;
    one process, or one of those torchrun started. A collective that fails (a process died or
    stopped answering) becomes one line naming the process."""
    dist = Dist.from_env(pick_device(cfg.train.device), cfg.train.dist_timeout)
    try:
        return _run(cfg, dist, resume, overwrite, log)
    except RuntimeError as e:
        if dist.joined and dist.is_collective_failure(e):
            raise dist.failure(e) from None
        raise
    finally:
        dist.close()


def _run(cfg: Config, dist: Dist, resume: bool, overwrite: bool, log) -> dict[str, float]:
    """The trainer's whole life, over when this returns: no reference to it is left when
    train() tears the process group down (Dist.close)."""
    init = None
    if cfg.train.init_from:  # fine-tuning: the model.* keys left out come from it
        init = init_from.read(cfg, dist)
        init_from.take_model_config(cfg, init)
    trainer = Trainer(cfg, dist, log, init)
    prepare_run_dir(trainer, resume, overwrite)
    return trainer.run()
