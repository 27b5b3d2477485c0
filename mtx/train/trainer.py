"""`mtx train`: the training loop.

The loop (`Trainer.loop`) takes this process's share of every update's batches (data.py),
runs the update (step.py's `Step`), logs (metrics.py), validates (validate.py) and checkpoints
(resume.py), surviving what faults.py handles. Under torchrun (mtx/distributed.py) N processes
train exactly as one process with N times the update_freq, and every decision the processes
must take alike (whether to stop, whether a checkpoint exists) comes from rank 0 or a
collective. A process that dies or stops answering ends the job with an error naming it,
within train.dist_timeout seconds.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time

import torch
import yaml
from tqdm import tqdm

from mtx.checkpoint import Checkpoint, RunDir
from mtx.config import PARTS, Config
from mtx.data import aligned, vocab
from mtx.data.batching import Batch
from mtx.data.prepared import load_manifest, load_prepared, load_sets, load_spm_proto
from mtx.device import pick_device
from mtx.distributed import Dist, joined
from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.model.build import make_model
from mtx.model.transformer import count_parameters
from mtx.tokens import SPECIALS
from mtx.train import compiled, data, init
from mtx.train.ema import Ema
from mtx.train.faults import OutOfMemory, StopSignals, check_nonfinite
from mtx.train.metrics import MetricsLog, TrainRecord, Window, summary_writer
from mtx.train.resume import StatefulParts, prepare_run_dir, restore, save_checkpoints
from mtx.train.state import TrainState
from mtx.train.step import UpdateStats, build_step
from mtx.train.validate import Validation, combine, valid_bleu, validate


def quiet(*_) -> None:
    pass


class Trainer:
    """A run: its data, its step (model, optimizer, precision), its position, and the loop
    that advances them."""

    def __init__(self, cfg: Config, dist: Dist, log=print, start: init.Start | None = None):
        self.cfg, self.dist, self.device = cfg, dist, dist.device
        self.run_dir = RunDir.of(cfg)
        self.log = log if dist.main else quiet
        self.progress: tqdm | None = None
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        spm_proto, manifest = load_spm_proto(cfg), load_manifest(cfg)
        self.manifest = manifest
        self.train_ds = load_prepared(cfg, "train")
        self.valid_sets = load_sets(cfg, "valid")
        names = [v.name for v in self.valid_sets]
        if cfg.train.best_valid and cfg.train.best_valid not in names:
            raise MtxError(
                f"train.best_valid {cfg.train.best_valid!r}: the prepared data's validation "
                f"sets are {', '.join(names)}; run `mtx prepare` with this config"
            )
        self.mix = data.Mix.of(self.train_ds, cfg.data)
        self.resegment, self.batching = None, cfg.train
        if cfg.data.bpe_dropout:  # BPE-dropout on the fly (data/bpe_dropout.py)
            tagged = bool(manifest.tags)
            self.resegment, self.batching = data.sampled(cfg, spm_proto, tagged, self.train_ds)
        self.links = None
        if cfg.train.align_weight:  # guided alignment: `mtx align`'s links (data/aligned.py)
            self.links = aligned.load(cfg, len(self.train_ds))
        dist.check_same_data(data.fingerprint(manifest, spm_proto, self.links))
        torch.manual_seed(cfg.train.seed)  # the same initial model on every process
        vocab.check_decoder_start(vocab.load(spm_proto), cfg.model.decoder_start)
        self.model = make_model(cfg.model, manifest.vocab_size).to(self.device)
        record = None
        if start is not None:
            record = init.load_weights(
                self.model, start, spm_proto, self.run_dir.prepared, cfg.train
            )
        self.frozen = self.model.freeze(cfg.train.freeze)  # before DDP sees what needs grads
        if dist.rank:
            torch.manual_seed(cfg.train.seed + dist.rank)  # but its own dropout
        self.step = build_step(cfg, self.model, self.device, dist.world, dist.joined, self.say)
        self.state = TrainState()
        ema = Ema(self.model, cfg.train.ema) if cfg.train.ema else None  # after freezing
        self.parts = StatefulParts(
            self.model, self.step.optimizer, self.step.scaler, self.state, ema
        )
        if start is not None:
            init.load_optimizer(self.step.optimizer, self.state, start, cfg.train)
        # what every checkpoint of the run holds beside the weights and the position
        self.header = Checkpoint(
            copy.deepcopy(cfg), spm_proto, manifest.vocab_size, {}, manifest, init_from=record
        )
        self.window = Window(self.device)
        self.signals = StopSignals()
        t = cfg.train
        self.oom = OutOfMemory(t.max_oom, t.max_tokens, dist.joined, dist.rank)
        self.saved_step = -1

    def resume(self) -> None:
        """Continue from the run's newest loadable checkpoint, if it has one (resume.py)."""
        ckpt = restore(
            self.run_dir, self.dist, self.header, self.parts, self.cfg.train.seed, self.log
        )
        if ckpt is not None:
            self.step.weights_loaded()
            self.header = dataclasses.replace(self.header, init_from=ckpt.init_from)

    def run(self) -> Validation | None:
        """Train until train.max_steps, train.max_minutes, train.patience or a stop signal;
        returns the last validation (None if the run was stopped before validating)."""
        cfg = self.cfg
        if cfg.train.tensorboard:
            summary_writer()  # a missing package fails before any work
        if self.dist.main:
            self.run_dir.root.mkdir(parents=True, exist_ok=True)
            text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
            atomic_write_text(self.run_dir.config, trained_on(self.manifest) + text)
        for line in self.opening():
            self.log(line)
        tensorboard = self.run_dir.tensorboard if cfg.train.tensorboard else None
        first_step = self.state.step + 1 if self.state.step else 0
        self.metrics = MetricsLog(
            self.run_dir.metrics if self.dist.main else None, tensorboard, first_step
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
            with self.signals.catching():
                result = self.loop(start)
        finally:
            self.progress.close()
            self.metrics.close()
        self.log(self.ending((time.monotonic() - start) / 60))
        return result

    def opening(self) -> list[str]:
        """The run's first lines: the model, the processes, where it started from."""
        d, h = self.dist, self.header
        where = f"{d.world} process(es), {d.backend}, " if d.joined else ""
        lines = [
            f"model: {count_parameters(self.model):,} parameters, vocabulary {h.vocab_size}, "
            f"{where}device {self.device}, {self.step.precision.name}"
        ]
        if h.init_from:
            r = h.init_from
            kept = f", keeping its {' and '.join(r.kept)}" if r.kept else ""
            kept += f", its {' and '.join(r.parts)} only" if len(r.parts) < len(PARTS) else ""
            lines.append(f"starting from {r.path} (step {r.step}){kept}")
        if self.frozen:
            lines.append(f"frozen: {', '.join(self.cfg.train.freeze)} ({self.frozen:,} parameters)")
        return lines

    def ending(self, minutes: float) -> str:
        """The run's last line: why it stopped, and where its checkpoints are."""
        s, t, run = self.state, self.cfg.train, self.run_dir
        if s.out_of_patience(t.patience) and s.step < t.max_steps:
            best = s.best_valid_bleu if t.best_metric == "bleu" else s.best_valid_loss
            best = f"{best:.2f}" if t.best_metric == "bleu" else f"{best:.3f}"
            return (
                f"stopped early at step {s.step}: valid {t.best_metric} has not improved for "
                f"{s.stale} validations (train.patience {t.patience}); the best, {best} at "
                f"step {s.best_step}, is {run.best}"
            )
        if self.signals.received:
            return (
                f"stopped by {self.signals.received} at step {s.step}; saved {run.last}. "
                f"Resume with: mtx train --config {run.config} --resume"
            )
        return f"trained {s.step} steps in {minutes:.1f} min; checkpoints in {run.checkpoints}"

    def loop(self, start: float) -> Validation | None:
        state, t = self.state, self.cfg.train
        result = None
        finished = state.step >= t.max_steps or state.out_of_patience(t.patience)
        self.step.working_model.train()
        if not finished:
            rank, world = self.dist.rank, self.dist.world
            batches = data.stream(
                self.train_ds, self.batching, state.epoch, state.batch, rank, world,
                self.device, self.mix, self.resegment, SPECIALS[self.cfg.model.decoder_start].start,
                self.links,
            )  # fmt: skip
            pending: list = []
            for streamed in batches:
                pending.append(streamed.batch)
                if len(pending) < t.update_freq:
                    continue
                stats = self.update(pending, streamed.update_tokens)
                pending = []
                state.epoch, state.batch = streamed.after
                if stats is None:  # out of memory: the batches were skipped
                    continue
                state.step += 1
                self.progress.update(1)
                self.window.add(stats)
                if state.step % t.log_every == 0:
                    self.log_train(self.window.flush(state.step, stats.lr, self.dist))
                time_up, stop = self.should_stop(start)
                finished = state.step >= t.max_steps or time_up
                if state.step % t.valid_every == 0 or finished:
                    paused = time.monotonic()
                    result = self.validate_and_save(last=finished)
                    self.window.leave_out(time.monotonic() - paused)
                    finished = finished or state.out_of_patience(t.patience)
                if stop:
                    if self.saved_step != state.step:
                        self.save(is_best=False)
                    return result
                if finished:
                    break
        # A resumed finished run: validate if no best.pt was written (rank 0's disk decides).
        if self.dist.decide(lambda: not self.run_dir.best.is_file()):
            result = self.validate_and_save(last=True)
        return result

    def should_stop(self, start: float) -> tuple[bool, bool]:
        """(time is up, a stop signal came). Processes must agree on both, so under torchrun
        they compare notes at log and validation steps only (a collective costs a sync): time
        is rank 0's clock, a stop signal to any process stops all."""
        time_up = time.monotonic() - start >= (self.cfg.train.max_minutes * 60 or math.inf)
        stop = self.signals.received is not None
        if self.dist.enabled:
            step, t = self.state.step, self.cfg.train
            if step % t.log_every and step % t.valid_every and step < t.max_steps:
                return False, False
            time_up, stop = self.dist.any([time_up and self.dist.main, stop])
            if stop and not self.signals.received:
                self.signals.received = "a stop signal to another process"
        return time_up, stop

    def update(self, batches: list[Batch], ntokens: int) -> UpdateStats | None:
        """The next update, or None when its batches ran out of GPU memory and were skipped."""
        number = self.state.step + 1

        def report() -> None:
            tokens = sum(b.padded_tokens for b in batches)
            self.metrics.write(kind="oom", step=self.state.step, tokens=tokens)
            self.say(
                f"step {number}: out of memory on {len(batches)} batch(es) of {tokens} padded "
                "tokens; skipped them"
            )

        stats = self.oom.run(
            lambda: self.step(batches, number, ntokens),
            number,
            self.step.optimizer,
            self.device,
            report,
        )
        if stats is not None and self.parts.ema is not None:
            self.parts.ema.update(self.model)
        return stats

    def say(self, message: str) -> None:
        if self.dist.main:
            (self.progress or tqdm).write(message)

    def log_train(self, record: TrainRecord) -> None:
        if self.step.module.is_compiled:
            record.compiled = compiled.stats()
        self.metrics.write(kind="train", **record.record())
        if record.skipped:
            self.say(
                f"step {record.step}: {record.skipped} update(s) skipped since the last "
                "log line (non-finite loss or gradient)"
            )
        self.check_nonfinite()
        compilations = {"compiles": record.compiled.compilations} if record.compiled else {}
        if record.align_loss is not None:
            compilations["align"] = f"{record.align_loss:.3f}"
        self.progress.set_postfix(
            loss="skipped" if record.loss is None else f"{record.loss:.3f}",
            lr=f"{record.lr:.2e}",
            tok_s=f"{record.tokens_per_s:.0f}",
            **compilations,
        )

    def check_nonfinite(self) -> None:
        worst = self.window.worst_streak()
        check_nonfinite(worst, self.cfg.train.max_nonfinite, self.state.step, self.run_dir.last)

    def save(self, is_best: bool) -> None:
        """The run's checkpoints at this step (every process calls it; rank 0 writes)."""
        keep = self.cfg.train.keep_last
        save_checkpoints(self.run_dir, self.dist, self.header, self.parts, is_best, keep)
        self.saved_step = self.state.step

    def validate_and_save(self, last: bool = False) -> Validation:
        """Validate (loss; BLEU and chrF every train.bleu_every validations and at the `last`),
        note the best, checkpoint, and report."""
        self.check_nonfinite()
        cfg, t = self.cfg, self.cfg.train
        start = time.monotonic()
        precision = self.step.precision
        model = self.step.working_model  # bf16-weights: the bf16 copy, as it trains
        number = self.state.step // t.valid_every  # validations so far, this one included
        bleu = t.bleu_every and (last or number % t.bleu_every == 0)
        per_set, all_hyps, bleu_seconds = {}, [], 0.0
        ema = self.parts.ema  # train.ema: the average is validated
        with ema.swapped(self.model) if ema else contextlib.nullcontext():
            for v in self.valid_sets:
                per_set[v.name] = validate(model, v.ds, cfg, precision, self.dist)
                if bleu:
                    bleu_start = time.monotonic()
                    args = (v.ds, self.header.spm_model, cfg, precision, self.dist, v.tgt_lang)
                    scores, hyps = valid_bleu(model, *args)
                    per_set[v.name] = per_set[v.name].with_bleu(scores.bleu, scores.chrf)
                    all_hyps += hyps
                    bleu_seconds += time.monotonic() - bleu_start
        result = combine(per_set, t.best_valid)
        if bleu:
            if self.dist.main:  # the sets' translations one after the other, as prepared
                atomic_write_text(self.run_dir.valid_hyp, "".join(h + "\n" for h in all_hyps))
            result.bleu_seconds = bleu_seconds
        result.seconds = time.monotonic() - start
        is_best = self.state.observe(result.summary, t.best_metric)
        self.save(is_best)
        self.metrics.write(kind="valid", step=self.state.step, best=is_best, **result.record())
        self.say(validation_line(self.state.step, result, is_best))
        return result


def validation_line(step: int, result: Validation, is_best: bool) -> str:
    """The progress line of a validation; with several sets, each set's loss and BLEU after
    the figures best.pt follows."""
    summary = result.summary
    bleu = ""
    if summary.bleu is not None:
        bleu = f", BLEU {summary.bleu:.2f}, chrF {summary.chrf:.2f}"
    sets = ""
    for name, scores in result.sets.items():
        sets += f"; {name} loss {scores.loss:.3f}" + (
            f" BLEU {scores.bleu:.2f}" if scores.bleu is not None else ""
        )
    return (
        f"step {step}: valid loss {summary.loss:.3f}, "
        f"ppl {summary.ppl:.2f}{bleu}" + (" (best)" if is_best else "") + sets
    )


def train(
    cfg: Config, resume: bool = False, overwrite: bool = False, log=print
) -> Validation | None:
    """`mtx train`: train on RUN/prepared, from scratch or from the run's newest checkpoint;
    one process, or one of those torchrun started. A collective that fails (a process died or
    stopped answering) becomes one line naming the process."""
    with joined(pick_device(cfg.train.device), cfg.train.dist_timeout) as dist:
        return _run(cfg, dist, resume, overwrite, log)


def _run(cfg: Config, dist: Dist, resume: bool, overwrite: bool, log) -> Validation | None:
    """The trainer's whole life, over when this returns: no reference to it is left when
    train() tears the process group down (Dist.close)."""
    start = None
    if cfg.train.init_from:  # fine-tuning: the model.* keys left out come from it
        start = init.read(cfg, dist)
        init.take_model_config(cfg, start)
    trainer = Trainer(cfg, dist, log, start)
    prepare_run_dir(trainer.run_dir, dist, resume, overwrite, trainer.log)
    if resume:
        trainer.resume()
    return trainer.run()


def trained_on(manifest) -> str:
    """config.yaml's first lines: the data the run trained on, as `mtx prepare` read it (its
    manifest), which data.* below need not name (a run may train on data prepared by another
    config, as a student on distilled data)."""
    lines = ["# trained on the data prepared in prepared/ (its manifest.json):"]
    for split, record in manifest.splits.items():
        lines.append(f"#   {split}: {record.source} ({record.kept:,} pairs)")
    return "\n".join(lines) + "\n"
