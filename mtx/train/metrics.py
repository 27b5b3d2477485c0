"""What a run reports: RUN/metrics.jsonl, and the window of losses and token counts between two
log lines, kept on the device until read, which becomes a log line's `TrainRecord`."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from mtx.distributed import Dist
from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.train.compiled import Compilations
from mtx.train.step import UpdateStats


@dataclasses.dataclass
class TrainRecord:
    """A log line's figures, over the updates since the last one and all processes: the
    label-smoothed loss, NLL and perplexity per target token of the updates applied (None:
    every update was skipped), the learning rate, the mean gradient norm, source + target
    and target tokens per second, the share of padding, the updates skipped, and (a compiled
    step) what was compiled so far."""

    step: int
    loss: float | None
    nll: float | None
    ppl: float | None
    lr: float
    grad_norm: float | None
    tokens_per_s: float
    tgt_tokens_per_s: float
    padding: float
    skipped: int
    compiled: Compilations | None = None
    align_loss: float | None = None  # guided alignment's loss per target token (else absent)

    def record(self) -> dict:
        """Its metrics.jsonl record (without kind)."""
        out = dataclasses.asdict(self)
        del out["compiled"]
        if self.align_loss is None:
            del out["align_loss"]
        return out | (self.compiled.record() if self.compiled else {})


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl (path None: writes nothing, for
    the processes other than the main one), and with `tensorboard` (a directory) writes every
    number of every record there too, as TensorBoard scalars: record kind "train" to
    DIR/train, "valid" to DIR/valid, tagged by the key without its "valid_" prefix (so
    TensorBoard draws train/loss and valid/loss in one chart). A run resumed at step S
    continues from `first_step` = S + 1: what an earlier attempt wrote from there is dropped."""

    def __init__(self, path: Path | None, tensorboard: Path | None = None, first_step: int = 0):
        self.file = open(path, "a", encoding="utf-8") if path else None
        self.tensorboard, self.first_step = (tensorboard if path else None), first_step
        self.writers: dict = {}

    def write(self, **record) -> None:
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.tensorboard:
            self.write_scalars(record)

    def write_scalars(self, record: dict) -> None:
        kind, step = record["kind"], record["step"]
        if kind not in self.writers:
            SummaryWriter = summary_writer()
            self.writers[kind] = SummaryWriter(
                str(self.tensorboard / kind), purge_step=self.first_step or None
            )
        writer = self.writers[kind]
        for key, value in record.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and key not in ("kind", "step"):
                writer.add_scalar(key.removeprefix(f"{kind}_"), value, step)
        writer.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()
        for writer in self.writers.values():
            writer.close()


def summary_writer():
    """torch.utils.tensorboard's SummaryWriter, or an error saying what to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise MtxError(
            "train.tensorboard needs the tensorboard package: pip install tensorboard "
            "(or `pip install mtx[tensorboard]`)"
        ) from None
    return SummaryWriter


def _lines(path: Path) -> Iterator[tuple[int, str, dict | None, str]]:
    """(line number, line, its record or None, why not) of each non-blank line of a
    metrics.jsonl; a line is a record if it is a JSON object with a step."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            yield n, line, None, "not a JSON line"
            continue
        if isinstance(record, dict) and "step" in record:
            yield n, line, record, ""
        else:
            yield n, line, None, "a metrics line needs a step"


def read_metrics(path: Path, kind: str | None = None, strict: bool = False) -> list[dict]:
    """The records of a metrics.jsonl (those of `kind`, if given), in order; no file, no
    records. A line cut short (by a crash, or a writer still writing it) is left out; with
    `strict`, a line that is not a record is an error naming it."""
    if not path.is_file():
        return []
    records = []
    for n, line, record, why in _lines(path):
        if record is None and strict:
            raise MtxError(f"{path}:{n}: {why}")
        if record is None or not (strict or line.endswith("\n")):
            continue
        if kind is None or record.get("kind") == kind:
            records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the complete metrics records up to `step`: a resumed run rewrites what follows."""
    if not path.is_file():
        return
    kept = [
        line for _, line, r, _ in _lines(path) if r and line.endswith("\n") and r["step"] <= step
    ]
    atomic_write_text(path, "".join(kept))


class Window:
    """Loss and token sums since the last log line, kept on the device until read."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.streak = torch.zeros((), dtype=torch.long, device=device)  # skipped in a row
        self.reset()

    def reset(self) -> None:
        zero = torch.zeros((), device=self.device)
        self.loss = self.nll = self.good_tgt_tokens = self.grad_norm = zero
        self.align = None  # guided alignment's loss sum
        self.skipped = torch.zeros((), dtype=torch.long, device=self.device)
        self.worst = self.streak.clone()
        self.tgt_tokens = self.src_tokens = self.padded_tokens = self.updates = 0
        self.t = time.monotonic()

    def add(self, stats: UpdateStats) -> None:
        skipped = stats.skipped.long()
        self.loss, self.nll = self.loss + stats.loss, self.nll + stats.nll
        if stats.align is not None:
            self.align = stats.align if self.align is None else self.align + stats.align
        self.good_tgt_tokens = self.good_tgt_tokens + (1 - skipped) * stats.tgt_tokens
        self.skipped = self.skipped + skipped
        self.grad_norm = self.grad_norm + stats.grad_norm
        self.updates += 1
        self.streak = (self.streak + 1) * skipped
        self.worst = torch.maximum(self.worst, self.streak)
        self.tgt_tokens += stats.tgt_tokens
        self.src_tokens += stats.src_tokens
        self.padded_tokens += stats.padded_tokens

    def leave_out(self, seconds: float) -> None:
        """Take `seconds` (a validation, a checkpoint) out of the window's clock: its tokens/s
        is the training's alone."""
        self.t += seconds

    def worst_streak(self) -> int:
        return int(self.worst)  # the same on every process: skipping is decided together

    def flush(self, step: int, lr: float, dist: Dist) -> TrainRecord:
        """The window's record, summed over all processes, and a fresh window."""
        elapsed = max(time.monotonic() - self.t, 1e-9)
        guided = self.align is not None
        align = self.align if guided else torch.zeros((), device=self.device)
        loss, nll, good, skipped, grad_norm, align = torch.stack(
            [self.loss, self.nll, self.good_tgt_tokens, self.skipped.float(), self.grad_norm, align]
        ).tolist()  # the only host-device synchronisation
        skipped = int(skipped)
        applied = self.updates - skipped  # the gradient norm is the same on every process
        loss, nll, good, tgt, src, padded, align = dist.sum(
            [loss, nll, good, self.tgt_tokens, self.src_tokens, self.padded_tokens, align]
        )
        nll = nll / good if good else None  # None (JSON null): every update was skipped
        record = TrainRecord(
            step=step,
            loss=loss / good if good else None,
            nll=nll,
            ppl=math.exp(min(nll, 100.0)) if good else None,
            lr=lr,
            grad_norm=grad_norm / applied if applied else None,
            tokens_per_s=(tgt + src) / elapsed,
            tgt_tokens_per_s=tgt / elapsed,
            padding=1 - (tgt + src) / padded if padded else 0.0,
            skipped=skipped,
            align_loss=align / good if guided and good else None,
        )
        self.reset()
        return record
