"""A corpus job: every line of a corpus (one file, or several read side by side) turned into
its output text, written into a file that lines up with it, resumable after a kill.

    mtx translate --checkpoint T.pt --input train.en --output train.teacher.de [--resume]
    mtx score --checkpoint T.pt --src train.en --tgt train.de --output scores [--resume]

The output holds `per_line` lines per input line (with --nbest N, N lines 'LINE ||| TEXT |||
SCORE ||| LOG-PROBABILITY'), written chunk by chunk, each chunk flushed to disk before the next
is computed, with its progress on stderr (mtx/progress.py: a bar on a terminal, plain lines in
a log). Beside it, OUTPUT.progress.json records what the run computes (the input's path and
size, the checkpoints, the settings, nbest).

`--resume` continues a killed run: the output's complete lines are kept (an input line counts
when all its lines end in a newline), whatever a kill left after them is cut, those input
lines are skipped, and the job goes on from the next. Since a line's output depends on that
line alone (decode/translator.py: not on its batch, its neighbours or, with sampling, on
anything but the seed and its line number; decode/score.py likewise), the continued file is
the same, line for line, as one written without interruption (tested with kill -9). Resuming
a finished run computes nothing more; resuming with another input, checkpoint, setting or
nbest than the record says is refused in one line. Under torchrun the job is spread over the
processes (shards.py), and the file is the same again.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtx.data.sources import count_lines, read_lines
from mtx.decode.stream import chunks
from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.progress import Progress


@dataclass
class Record:
    """What a corpus translation translates: resuming must translate the same."""

    input: str
    input_bytes: int
    checkpoints: list[str]
    settings: list[str]
    nbest: int

    @staticmethod
    def path(output: Path) -> Path:
        return output.with_name(output.name + ".progress.json")


def complete(output: Path, per_line: int) -> int:
    """Input lines whose `per_line` output lines are all complete in `output`; what follows
    them (a line cut short, part of an n-best block) is cut off the file."""
    done, keep, lines = 0, 0, 0
    with open(output, "rb") as f:
        position = 0
        for raw in f:
            position += len(raw)
            if not raw.endswith(b"\n"):
                break
            lines += 1
            if lines % per_line == 0:
                done, keep = lines // per_line, position
    with open(output, "rb+") as f:
        f.truncate(keep)
    return done


def start(output: Path, record: Record, resume: bool, per_line: int | None = None) -> int:
    """Input lines already translated into `output` (0 for a new run), after checking that a
    resumed run translates what the record says; `per_line`: output lines an input line
    gives (None: the record's nbest)."""
    if output.exists() and not resume:
        raise MtxError(f"{output} exists: --resume continues it, or remove it first")
    check_record(output, record, output.exists())
    if not output.exists():
        output.write_bytes(b"")
        return 0
    return complete(output, per_line or record.nbest)


def check_record(output: Path, record: Record, begun: bool) -> None:
    """A new output's record written beside it; a `begun` one's compared with `record` (what
    this run would compute), a difference refused in one line."""
    saved = Record.path(output)
    if not begun:
        atomic_write_text(saved, json.dumps(asdict(record), indent=1) + "\n")
        return
    if not saved.is_file():
        raise MtxError(
            f"{output}: no {saved.name} beside it, so nothing says how it was begun: remove "
            "the output to translate again"
        )
    before = json.loads(saved.read_text())
    for key, value in asdict(record).items():
        if before.get(key) != value:
            raise MtxError(
                f"--resume: {key} is {value!r} but {output} was begun with {before.get(key)!r}"
            )


@dataclass
class CorpusJob:
    """Work that turns each line of a corpus (`inputs`, read side by side) into its output
    text, in chunks: `render(first line number, rows)` gives each row's text (`per_line` output
    lines, each ending in a newline); `record` says what the job computes, `verb` and `unit`
    its progress; `reports`, dataclasses of counts (ints, or dicts of ints) summed over the
    processes."""

    inputs: list[Path]
    record: Record
    per_line: int
    render: Callable[[int, list[tuple[str, ...]]], list[str]]
    verb: str = "translated"
    unit: str = "lines"
    reports: tuple[Any, ...] = ()


@dataclass
class Done:
    """What a corpus job did: `lines` computed by this command (by all its processes);
    `main`, whether this process is the one that wrote the output and speaks for the job."""

    lines: int
    main: bool = True
    processes: int = 1
    before: int = 0  # lines an earlier run had done
    merged: tuple[int, float] | None = None  # bytes rank 0 merged from the parts, seconds


def checked(job: CorpusJob, first: int, rows: list[tuple[str, ...]]) -> list[str]:
    """`job.render`'s texts for `rows`, one a row (a bug otherwise)."""
    texts = job.render(first, rows)
    if len(texts) != len(rows):
        raise AssertionError(f"{len(texts)} outputs for {len(rows)} lines")
    return texts


def input_lines(inputs: list[Path]) -> int:
    """The lines of the job's inputs: the same in each, or refused in one line."""
    counts = [count_lines(p) for p in inputs]
    for path, n in zip(inputs[1:], counts[1:]):
        if n != counts[0]:
            raise MtxError(
                f"{inputs[0]} has {counts[0]} lines but {path} has {n}: they must pair up"
            )
    return counts[0]


def run_alone(job: CorpusJob, output: Path, resume: bool = False, chunk_lines: int = 512) -> Done:
    """`job` into `output` in this process, resuming it if asked."""
    total = input_lines(job.inputs)
    done = start(output, job.record, resume, job.per_line)
    rows = zip(*(itertools.islice(read_lines(p), done, None) for p in job.inputs), strict=True)
    written = 0
    with open(output, "ab") as f, Progress(total, job.verb, job.unit, initial=done) as bar:
        for chunk in chunks(rows, chunk_lines):
            flush(f, checked(job, done + written, chunk))
            bar.update(len(chunk))
            written += len(chunk)
    return Done(written, before=done)


def flush(f, texts: list[str]) -> None:
    """One chunk's outputs to disk: written, flushed and synced before the next chunk."""
    if texts:
        f.write("".join(texts).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
