"""`mtx train`: the training loop; the step, validation and checkpointing are what it calls.

One update (`train_step`) consumes `update_freq` token-budget batches, normalises the summed
label-smoothed loss by the number of target tokens, clips the gradient norm if asked, and sets
the learning rate from the paper's schedule. The loss is read back from the device only when
logging, so the step has no host-device synchronisation.

Faults lose nothing: an update with a non-finite loss or gradient is skipped on the device
(the fused Adam step is told `found_inf`) and counted; a batch that runs out of GPU memory is
skipped; SIGTERM/SIGINT save a resumable checkpoint at the next step boundary and end the run
cleanly. Too many of either fault in a row stop the run with advice.
"""

from __future__ import annotations

import contextlib
import json
import math
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
from mtx.data.prepare import load_prepared, load_spm_proto, prepared_dir
from mtx.errors import MtxError
from mtx.files import atomic_write_text, remove_stale_temporaries
from mtx.model.transformer import PAD_ID, Transformer, count_parameters
from mtx.train import checkpoint
from mtx.train.loss import label_smoothed_nll
from mtx.train.schedule import rate


@dataclass
class TrainState:
    step: int = 0  # updates done
    epoch: int = 0  # current pass over the data
    batch: int = 0  # batches of the current epoch already consumed
    best_valid_loss: float = math.inf


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MtxError(f"train.device is {name!r} but no CUDA device is available")
    return torch.device(name)


def autocast_for(device: torch.device, precision: str):
    """bf16 autocast on GPUs that support it (precision auto/bf16), full fp32 otherwise."""
    bf16 = precision == "bf16" or (
        precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Adam:
    """Adam as in the paper; fused, so that a non-finite update is skipped on the device."""
    return torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
        eps=cfg.train.adam_eps,
        fused=True,
    )


def train_step(model, optimizer, batches, cfg: Config, step: int, device, autocast) -> dict:
    """One update from `batches`; returns device tensors (summed losses, whether the update was
    skipped for a non-finite loss or gradient) and host token counts."""
    lr = rate(step, cfg.model.d_model, cfg.train.warmup_steps, cfg.train.lr_scale)
    for group in optimizer.param_groups:
        group["lr"] = lr
    ntokens = sum(int((b["tgt_out"] != PAD_ID).sum()) for b in batches)  # counted on the host
    loss_sum = nll_sum = torch.zeros((), device=device)
    for b in batches:
        b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
        with autocast:
            logits = model(b["src"], b["tgt_in"])
        loss, nll = label_smoothed_nll(logits, b["tgt_out"], cfg.train.label_smoothing, PAD_ID)
        (loss / ntokens).backward()
        loss_sum, nll_sum = loss_sum + loss.detach(), nll_sum + nll.detach()
    if cfg.train.clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm(
            [p.grad for p in model.parameters() if p.grad is not None]
        )
    skipped = ~(torch.isfinite(norm) & torch.isfinite(loss_sum))
    # The fused Adam kernels read `found_inf` on the device and leave parameters, moments and
    # step count untouched when it is 1 (the mechanism torch.amp.GradScaler uses): no sync.
    optimizer.found_inf = skipped.float()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    src_tokens = sum(int((b["src"] != PAD_ID).sum()) for b in batches)
    return {
        "loss": torch.where(skipped, 0.0, loss_sum),
        "nll": torch.where(skipped, 0.0, nll_sum),
        "skipped": skipped,
        "tgt_tokens": ntokens,
        "src_tokens": src_tokens,
        "lr": lr,
    }


@torch.no_grad()
def validate(model, valid_ds, cfg: Config, device, autocast) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on the validation split."""
    model.eval()
    batches = token_batches(*lengths(valid_ds), cfg.train.max_tokens)
    loss_sum = nll_sum = torch.zeros((), device=device, dtype=torch.float64)
    ntokens = 0
    for b in BatchDataset(valid_ds, batches):
        ntokens += int((b["tgt_out"] != PAD_ID).sum())
        b = {k: v.to(device) for k, v in b.items()}
        with autocast:
            logits = model(b["src"], b["tgt_in"])
        loss, nll = label_smoothed_nll(logits, b["tgt_out"], cfg.train.label_smoothing, PAD_ID)
        loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
    model.train()
    nll = nll_sum.item() / max(ntokens, 1)
    return {
        "valid_loss": loss_sum.item() / max(ntokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 100.0)),
    }


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")

    def write(self, **record) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Trainer:
    """A run: its data, model, optimizer and position, and the loop that advances them."""

    def __init__(self, cfg: Config, log=print) -> None:
        self.cfg, self.log = cfg, log
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.device = pick_device(cfg.train.device)
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        self.autocast = autocast_for(self.device, cfg.train.precision)
        self.train_ds, self.valid_ds = load_prepared(cfg, "train"), load_prepared(cfg, "valid")
        self.spm_proto = load_spm_proto(cfg)
        manifest = json.loads((prepared_dir(cfg) / "manifest.json").read_text())
        self.vocab_size = manifest["vocab_size"]
        torch.manual_seed(cfg.train.seed)
        self.model = Transformer(cfg.model, self.vocab_size).to(self.device)
        self.optimizer = make_optimizer(self.model, cfg)
        self.state = TrainState()
        self.window = Window(self.device)
        self.stop_signal: str | None = None  # set by SIGTERM/SIGINT; acted on between steps
        self.ooms_in_a_row = 0
        self.saved_step = -1

    def batches(self) -> torch.utils.data.DataLoader:
        """The rest of the current epoch's batches, in the order fixed by (seed, epoch)."""
        order = token_batches(
            *lengths(self.train_ds),
            self.cfg.train.max_tokens,
            self.cfg.train.seed,
            self.state.epoch,
        )
        return torch.utils.data.DataLoader(
            BatchDataset(self.train_ds, order[self.state.batch :]),
            batch_size=None,
            pin_memory=self.device.type == "cuda",
            generator=torch.Generator(),  # keeps the global RNG (dropout) untouched by loaders
        )

    def run(self) -> dict[str, float]:
        """Train until train.max_steps, train.max_minutes or a stop signal; returns the last
        validation (empty if the run was stopped before validating)."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            self.run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False)
        )
        params = count_parameters(self.model)
        self.log(
            f"model: {params:,} parameters, vocabulary {self.vocab_size}, device {self.device}"
        )
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.progress = tqdm(
            total=cfg.train.max_steps,
            initial=self.state.step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=None,
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
        deadline = cfg.train.max_minutes * 60 or math.inf
        result: dict[str, float] = {}
        pending: list = []
        self.model.train()
        while state.step < cfg.train.max_steps and time.monotonic() - start < deadline:
            for batch in self.batches():
                pending.append(batch)
                state.batch += 1
                if len(pending) < cfg.train.update_freq:
                    continue
                stats = self.update(pending)
                pending = []
                if stats is None:  # out of memory: the batches were skipped
                    continue
                state.step += 1
                self.progress.update(1)
                self.window.add(stats)
                if state.step % cfg.train.log_every == 0:
                    self.log_train(self.window.flush(state.step, stats["lr"]))
                done = state.step >= cfg.train.max_steps or time.monotonic() - start >= deadline
                if state.step % cfg.train.valid_every == 0 or done:
                    result = self.validate_and_save()
                if self.stop_signal:
                    if self.saved_step != state.step:
                        self.save(is_best=False)
                    return result
                if done:
                    break
            else:
                state.epoch, state.batch = state.epoch + 1, 0
        if not (self.ckpt_dir / "best.pt").is_file():  # resumed a finished run
            result = self.validate_and_save()
        return result

    def update(self, batches: list) -> dict | None:
        """train_step, or None when the batches ran out of GPU memory and were skipped."""
        try:
            stats = train_step(
                self.model,
                self.optimizer,
                batches,
                self.cfg,
                self.state.step + 1,
                self.device,
                self.autocast,
            )
            self.ooms_in_a_row = 0
            return stats
        except torch.OutOfMemoryError:
            pass  # recover outside the except block, where the failed step's tensors are freed
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.ooms_in_a_row += 1
        tokens = sum(int(b["src"].numel() + b["tgt_in"].numel()) for b in batches)
        self.metrics.write(kind="oom", step=self.state.step, tokens=tokens)
        self.progress.write(
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

    def log_train(self, record: dict) -> None:
        self.metrics.write(kind="train", **record)
        if record["skipped"]:
            self.progress.write(
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
        result = validate(self.model, self.valid_ds, self.cfg, self.device, self.autocast)
        is_best = result["valid_loss"] < self.state.best_valid_loss
        if is_best:
            self.state.best_valid_loss = result["valid_loss"]
        self.save(is_best)
        self.metrics.write(kind="valid", step=self.state.step, best=is_best, **result)
        self.progress.write(
            f"step {self.state.step}: valid loss {result['valid_loss']:.3f}, "
            f"ppl {result['valid_ppl']:.2f}" + (" (best)" if is_best else "")
        )
        return result

    def save(self, is_best: bool) -> None:
        """best.pt (weights) if best, then step-N.pt and last.pt (resumable: optimizer, data
        position, RNG). In this order a crash between two writes leaves a consistent run:
        resuming from the older last.pt replays the steps and rewrites the newer files."""
        common = {
            "config": self.cfg.to_dict(),
            "spm_model": self.spm_proto,
            "vocab_size": self.vocab_size,
            "model": self.model.state_dict(),
            "step": self.state.step,
            "best_valid_loss": self.state.best_valid_loss,
        }
        resume = {
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.state.epoch,
            "batch": self.state.batch,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        if is_best:
            checkpoint.save(self.ckpt_dir / "best.pt", common)
        if self.cfg.train.keep_last > 0:
            checkpoint.save(checkpoint.step_path(self.ckpt_dir, self.state.step), common | resume)
            checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last)
        checkpoint.save(self.ckpt_dir / "last.pt", common | resume)
        self.saved_step = self.state.step

    def restore(self) -> None:
        """Continue from the newest loadable checkpoint, or start afresh if there is none."""
        stale = remove_stale_temporaries(self.ckpt_dir) + remove_stale_temporaries(self.run_dir)
        for path in stale:
            self.log(f"removed {path}, left by an interrupted write")
        found = checkpoint.load_resumable(self.ckpt_dir, self.log)
        if found is None:
            self.log(f"no checkpoint in {self.ckpt_dir}: starting from step 0")
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
        torch.set_rng_state(ckpt["rng"])
        if ckpt["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
        self.state = TrainState(ckpt["step"], ckpt["epoch"], ckpt["batch"], ckpt["best_valid_loss"])
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
        self.tgt_tokens = self.src_tokens = 0
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

    def worst_streak(self) -> int:
        return int(self.worst)

    def flush(self, step: int, lr: float) -> dict:
        elapsed = max(time.monotonic() - self.t, 1e-9)
        loss, nll, good, skipped = torch.stack(
            [self.loss, self.nll, self.good_tgt_tokens, self.skipped.float()]
        ).tolist()  # the only host-device synchronisation
        nll = nll / good if good else None  # None (JSON null): every update was skipped
        record = {
            "step": step,
            "loss": loss / good if good else None,
            "nll": nll,
            "ppl": math.exp(min(nll, 100.0)) if good else None,
            "lr": lr,
            "tokens_per_s": (self.tgt_tokens + self.src_tokens) / elapsed,
            "tgt_tokens_per_s": self.tgt_tokens / elapsed,
            "skipped": int(skipped),
        }
        self.reset()
        return record


def train(
    cfg: Config, resume: bool = False, overwrite: bool = False, log=print
) -> dict[str, float]:
    """`mtx train`: train on RUN/prepared, from scratch or from the run's newest checkpoint.

    A run directory that already holds checkpoints is never silently overwritten: resume it,
    or say `overwrite` to delete its checkpoints and metrics and start again.
    """
    run_dir = Path(cfg.run_dir)
    old = [run_dir / "checkpoints", run_dir / "metrics.jsonl"]
    if not resume and any(p.exists() for p in old):
        if not overwrite:
            raise MtxError(
                f"{run_dir} already holds a training run: pass --resume to continue it, "
                "--overwrite to start again, or choose another run_dir"
            )
        shutil.rmtree(old[0], ignore_errors=True)
        old[1].unlink(missing_ok=True)
    trainer = Trainer(cfg, log)
    if resume:
        trainer.restore()
    return trainer.run()
