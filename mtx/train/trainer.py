"""`mtx train`: the training loop, with its step, validation and checkpointing as functions.

One update (`train_step`) consumes `update_freq` token-budget batches, normalises the summed
label-smoothed loss by the number of target tokens, clips the gradient norm if asked, and sets
the learning rate from the paper's schedule. The loss is read back from the device only when
logging, so the step has no host-device synchronisation.
"""

from __future__ import annotations

import contextlib
import json
import math
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


def save_checkpoints(
    run_dir: Path,
    model,
    optimizer,
    cfg: Config,
    state: TrainState,
    spm_proto: bytes,
    vocab_size: int,
    is_best: bool,
) -> None:
    common = {
        "config": cfg.to_dict(),
        "spm_model": spm_proto,
        "vocab_size": vocab_size,
        "model": model.state_dict(),
        "step": state.step,
        "best_valid_loss": state.best_valid_loss,
    }
    ckpt_dir = run_dir / "checkpoints"
    checkpoint.save(
        ckpt_dir / "last.pt",
        common
        | {
            "optimizer": optimizer.state_dict(),
            "epoch": state.epoch,
            "batch": state.batch,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    )
    if is_best:
        checkpoint.save(ckpt_dir / "best.pt", common)


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")

    def write(self, **record) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def train(cfg: Config, resume: bool = False, log=print) -> dict[str, float]:
    """Train on RUN/prepared until train.max_steps or train.max_minutes; returns the last validation."""
    run_dir = Path(cfg.run_dir)
    device = pick_device(cfg.train.device)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    autocast = autocast_for(device, cfg.train.precision)
    train_ds, valid_ds = load_prepared(cfg, "train"), load_prepared(cfg, "valid")
    spm_proto = load_spm_proto(cfg)
    vocab_size = json.loads((prepared_dir(cfg) / "manifest.json").read_text())["vocab_size"]

    torch.manual_seed(cfg.train.seed)
    model = Transformer(cfg.model, vocab_size).to(device)
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
        eps=cfg.train.adam_eps,
        fused=device.type == "cuda",
    )
    state = TrainState()
    if resume:
        state = _restore(run_dir / "checkpoints" / "last.pt", model, optimizer, log)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    log(f"model: {count_parameters(model):,} parameters, vocabulary {vocab_size}, device {device}")

    metrics = MetricsLog(run_dir / "metrics.jsonl")
    src_lens, tgt_lens = lengths(train_ds)
    progress = tqdm(
        total=cfg.train.max_steps,
        initial=state.step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        disable=None,
        mininterval=1.0,
    )
    start, deadline = time.monotonic(), cfg.train.max_minutes * 60 or math.inf
    window = {"loss": 0.0, "nll": 0.0, "tgt_tokens": 0, "src_tokens": 0, "t": time.monotonic()}
    result: dict[str, float] = {}
    model.train()
    pending: list = []
    while state.step < cfg.train.max_steps and time.monotonic() - start < deadline:
        batches = token_batches(
            src_lens, tgt_lens, cfg.train.max_tokens, cfg.train.seed, state.epoch
        )
        loader = torch.utils.data.DataLoader(
            BatchDataset(train_ds, batches[state.batch :]),
            batch_size=None,
            pin_memory=device.type == "cuda",
            generator=torch.Generator(),  # keeps the global RNG (dropout) untouched by loaders
        )
        for batch in loader:
            pending.append(batch)
            state.batch += 1
            if len(pending) < cfg.train.update_freq:
                continue
            stats = train_step(model, optimizer, pending, cfg, state.step + 1, device, autocast)
            pending = []
            state.step += 1
            progress.update(1)
            for k in ("loss", "nll"):
                window[k] = window[k] + stats[k]
            window["tgt_tokens"] += stats["tgt_tokens"]
            window["src_tokens"] += stats["src_tokens"]
            if state.step % cfg.train.log_every == 0:
                record = _log_window(window, state.step, stats["lr"])
                metrics.write(kind="train", **record)
                progress.set_postfix(
                    loss=f"{record['loss']:.3f}",
                    lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tokens_per_s']:.0f}",
                )
            done = state.step >= cfg.train.max_steps or time.monotonic() - start >= deadline
            if state.step % cfg.train.valid_every == 0 or done:
                result = _validate_and_save(
                    model,
                    optimizer,
                    valid_ds,
                    cfg,
                    state,
                    device,
                    autocast,
                    run_dir,
                    spm_proto,
                    vocab_size,
                    metrics,
                    progress,
                )
            if done:
                break
        else:
            state.epoch, state.batch = state.epoch + 1, 0
    progress.close()
    metrics.close()
    if not (run_dir / "checkpoints" / "best.pt").is_file():  # e.g. resumed a finished run
        result = _validate_and_save(
            model,
            optimizer,
            valid_ds,
            cfg,
            state,
            device,
            autocast,
            run_dir,
            spm_proto,
            vocab_size,
            None,
            None,
        )
    minutes = (time.monotonic() - start) / 60
    log(
        f"trained {state.step} steps in {minutes:.1f} min; checkpoints in {run_dir / 'checkpoints'}"
    )
    return result


def _log_window(window: dict, step: int, lr: float) -> dict:
    now = time.monotonic()
    elapsed = max(now - window["t"], 1e-9)
    tokens = window["tgt_tokens"]
    loss, nll = float(window["loss"]) / tokens, float(window["nll"]) / tokens  # syncs here only
    record = {
        "step": step,
        "loss": loss,
        "nll": nll,
        "ppl": math.exp(min(nll, 100.0)),
        "lr": lr,
        "tokens_per_s": (tokens + window["src_tokens"]) / elapsed,
        "tgt_tokens_per_s": tokens / elapsed,
    }
    window.update(loss=0.0, nll=0.0, tgt_tokens=0, src_tokens=0, t=now)
    return record


def _validate_and_save(
    model,
    optimizer,
    valid_ds,
    cfg,
    state,
    device,
    autocast,
    run_dir,
    spm_proto,
    vocab_size,
    metrics,
    progress,
) -> dict:
    result = validate(model, valid_ds, cfg, device, autocast)
    is_best = result["valid_loss"] < state.best_valid_loss
    if is_best:
        state.best_valid_loss = result["valid_loss"]
    save_checkpoints(run_dir, model, optimizer, cfg, state, spm_proto, vocab_size, is_best)
    line = (
        f"step {state.step}: valid loss {result['valid_loss']:.3f}, "
        f"ppl {result['valid_ppl']:.2f}" + (" (best)" if is_best else "")
    )
    if metrics is not None:
        metrics.write(kind="valid", step=state.step, best=is_best, **result)
    (progress.write if progress is not None else print)(line)
    return result


def _restore(path: Path, model, optimizer, log) -> TrainState:
    ckpt = checkpoint.load(path)
    if "optimizer" not in ckpt:
        raise MtxError(f"{path}: holds no optimizer state, so it cannot be resumed")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"])
    if ckpt["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
    log(f"resuming from {path} at step {ckpt['step']}")
    return TrainState(ckpt["step"], ckpt["epoch"], ckpt["batch"], ckpt["best_valid_loss"])
