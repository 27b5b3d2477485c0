"""`mtx train`: the training loop; the step, validation and checkpointing are what it calls.

One update (`train_step`) consumes `update_freq` token-budget batches, normalises the summed
label-smoothed loss by the number of target tokens, clips the gradient norm if asked, and sets
the learning rate from the paper's schedule. The loss is read back from the device only when
logging, so the step has no host-device synchronisation.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
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


def train_step(model, optimizer, batches, cfg: Config, step: int, device, autocast) -> dict:
    """One update from `batches`; returns device tensors (summed losses) and token counts."""
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
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    src_tokens = sum(int((b["src"] != PAD_ID).sum()) for b in batches)
    return {
        "loss": loss_sum,
        "nll": nll_sum,
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
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=0.0,
            betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
            eps=cfg.train.adam_eps,
            fused=self.device.type == "cuda",
        )
        self.state = TrainState()

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
        """Train until train.max_steps or train.max_minutes; returns the last validation."""
        cfg, state = self.cfg, self.state
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        params = count_parameters(self.model)
        self.log(
            f"model: {params:,} parameters, vocabulary {self.vocab_size}, device {self.device}"
        )
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.progress = tqdm(
            total=cfg.train.max_steps,
            initial=state.step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=None,
            mininterval=1.0,
        )
        start, deadline = time.monotonic(), cfg.train.max_minutes * 60 or math.inf
        window = Window()
        result: dict[str, float] = {}
        pending: list = []
        self.model.train()
        while state.step < cfg.train.max_steps and time.monotonic() - start < deadline:
            for batch in self.batches():
                pending.append(batch)
                state.batch += 1
                if len(pending) < cfg.train.update_freq:
                    continue
                stats = train_step(
                    self.model,
                    self.optimizer,
                    pending,
                    cfg,
                    state.step + 1,
                    self.device,
                    self.autocast,
                )
                pending = []
                state.step += 1
                self.progress.update(1)
                window.add(stats)
                if state.step % cfg.train.log_every == 0:
                    self.log_train(window.flush(state.step, stats["lr"]))
                done = state.step >= cfg.train.max_steps or time.monotonic() - start >= deadline
                if state.step % cfg.train.valid_every == 0 or done:
                    result = self.validate_and_save()
                if done:
                    break
            else:
                state.epoch, state.batch = state.epoch + 1, 0
        if not (self.run_dir / "checkpoints" / "best.pt").is_file():  # resumed a finished run
            result = self.validate_and_save()
        self.progress.close()
        self.metrics.close()
        minutes = (time.monotonic() - start) / 60
        self.log(
            f"trained {state.step} steps in {minutes:.1f} min; "
            f"checkpoints in {self.run_dir / 'checkpoints'}"
        )
        return result

    def log_train(self, record: dict) -> None:
        self.metrics.write(kind="train", **record)
        self.progress.set_postfix(
            loss=f"{record['loss']:.3f}",
            lr=f"{record['lr']:.2e}",
            tok_s=f"{record['tokens_per_s']:.0f}",
        )

    def validate_and_save(self) -> dict[str, float]:
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
        """last.pt (resumable: optimizer, data position, RNG) and, if best, best.pt (weights)."""
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
        ckpt_dir = self.run_dir / "checkpoints"
        checkpoint.save(ckpt_dir / "last.pt", common | resume)
        if is_best:
            checkpoint.save(ckpt_dir / "best.pt", common)

    def restore(self, path: Path) -> None:
        ckpt = checkpoint.load(path)
        if "optimizer" not in ckpt:
            raise MtxError(f"{path}: holds no optimizer state, so it cannot be resumed")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        if ckpt["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
        self.state = TrainState(ckpt["step"], ckpt["epoch"], ckpt["batch"], ckpt["best_valid_loss"])
        self.log(f"resuming from {path} at step {ckpt['step']}")


class Window:
    """Loss and token sums since the last log line, kept on the device until read."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = 0.0
        self.tgt_tokens = self.src_tokens = 0
        self.t = time.monotonic()

    def add(self, stats: dict) -> None:
        self.loss, self.nll = self.loss + stats["loss"], self.nll + stats["nll"]
        self.tgt_tokens += stats["tgt_tokens"]
        self.src_tokens += stats["src_tokens"]

    def flush(self, step: int, lr: float) -> dict:
        elapsed = max(time.monotonic() - self.t, 1e-9)
        tokens = self.tgt_tokens
        nll = float(self.nll) / tokens  # the only host-device synchronisation
        record = {
            "step": step,
            "loss": float(self.loss) / tokens,
            "nll": nll,
            "ppl": math.exp(min(nll, 100.0)),
            "lr": lr,
            "tokens_per_s": (tokens + self.src_tokens) / elapsed,
            "tgt_tokens_per_s": tokens / elapsed,
        }
        self.reset()
        return record


def train(
    cfg: Config, resume: bool = False, overwrite: bool = False, log=print
) -> dict[str, float]:
    """`mtx train`: train on RUN/prepared, from scratch or from RUN/checkpoints/last.pt.

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
        trainer.restore(run_dir / "checkpoints" / "last.pt")
    return trainer.run()
