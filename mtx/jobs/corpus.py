"""A corpus job: every line of a corpus (one file, or several read side by side) turned into
its output text, written into a file that lines up with it, resumable after a kill.

    mtx translate --checkpoint T.pt --input train.en --output train.teacher.de [--resume]
    mtx score --checkpoint T.pt --src train.en --tgt train.de --output scores [--resume]

The output holds `per_line` lines per input line (with --nbest N, N lines 'LINE ||| TEXT |||
SCORE ||| LOG-PROBABILITY'), written chunk by chunk, each chunk flushed to disk before the next
is computed, with its progress on stderr (mtx/progress.py: a bar on a terminal, plain lines in
a log). Beside it, OUTPUT.progress.json records what the run computes (`Record`: the input's
path and size, the checkpoints, the request's options and the translator's settings that change
an output, typed, the other --set overrides, what else the job reads, the kind of device).

`--resume` continues a killed run: the output's complete lines are kept (an input line counts
when all its lines end in a newline), whatever a kill left after them is cut, those input
lines are skipped, and the job goes on from the next. Since a line's output depends on that
line alone (decode/translator.py: not on its batch, its neighbours or, with sampling, on
anything but the seed and its line number; decode/score.py likewise), the continued file is
the same, line for line, as one written without interruption (tested with kill -9). Resuming
a finished run computes nothing more; resuming with another input, checkpoint, option or
setting than the record says is refused in one line naming it (compared field by field).
Under torchrun the job is spread over the processes (shards.py), and the file is the same
again.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mtx.config import DecodeConfig
from mtx.config.keys import declared
from mtx.data.sources import count_lines, read_lines
from mtx.decode.options import Options, recorded_settings
from mtx.decode.parts import Parts
from mtx.decode.stream import chunks
from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.progress import Progress

DECODE_KEYS = frozenset(key for key, _, _ in declared(DecodeConfig, "decode."))


@dataclass
class Record:
    """What a corpus job computes: resuming must compute the same."""

    input: str  # the input's path, resolved
    input_bytes: int
    checkpoints: list[str]  # resolved
    options: dict[str, Any]  # the request's options that change an output (options.py)
    settings: dict[str, Any]  # the translator's other decode.* that change an output
    overrides: list[str] = field(default_factory=list)  # --set of other sections than decode
    reads: dict[str, Any] = field(default_factory=dict)  # what else the job reads, by name
    device: str = "cpu"  # the kind of device (which may change an output)

    @classmethod
    def of(
        cls, input: Path, parts: Parts, options: Options | None, overrides: list[str],
        reads: dict[str, Any] | None = None,
    ) -> Record:  # fmt: skip
        """The record of a job over `input` with a translator's `parts` under `options`
        (None: a job that only scores); `overrides` its --set (the decode.* ones are recorded
        resolved, in options and settings)."""
        asked = options.recorded() if options is not None else {}
        settings = recorded_settings(parts.config.decode)
        return cls(
            str(input.resolve()), input.stat().st_size,
            [str(Path(p).resolve()) for p in parts.checkpoints], asked,
            {k: v for k, v in settings.items() if k not in asked},
            [x for x in overrides if x.split("=", 1)[0].strip() not in DECODE_KEYS],
            reads or {}, parts.device.type,
        )  # fmt: skip

    @staticmethod
    def path(output: Path) -> Path:
        return output.with_name(output.name + ".progress.json")

    def differences(self, before: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
        """(name, this record's value, `before`'s) of each field that differs from a record
        read back (`before`), a dict field's key by key."""
        for key, value in asdict(self).items():
            was = before.get(key)
            if isinstance(value, dict) and isinstance(was, dict):
                for name in sorted(set(value) | set(was)):
                    if value.get(name) != was.get(name):
                        yield f"{key}.{name}", value.get(name), was.get(name)
            elif was != value:
                yield key, value, was


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


def start(output: Path, record: Record, resume: bool, per_line: int) -> int:
    """Input lines already translated into `output` (0 for a new run), after checking that a
    resumed run translates what the record says; `per_line`: output lines an input line
    gives."""
    if output.exists() and not resume:
        raise MtxError(f"{output} exists: --resume continues it, or remove it first")
    check_record(output, record, output.exists())
    if not output.exists():
        output.write_bytes(b"")
        return 0
    return complete(output, per_line)


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
    for key, value, was in record.differences(before):
        raise MtxError(f"--resume: {key} is {value!r} but {output} was begun with {was!r}")


class Counted(Protocol):
    """What a job counts as it goes (a translator's `Stats`), summed over the processes."""

    def merge(self, other: Any) -> None: ...


@dataclass
class CorpusJob:
    """Work that turns each line of a corpus (`inputs`, read side by side) into its output
    text, in chunks: `render(first line number, rows)` gives each row's text (`per_line` output
    lines, each ending in a newline); `record` says what the job computes, `verb` and `unit`
    its progress; `counted`, what it counts, summed over the processes (its `merge`)."""

    inputs: list[Path]
    record: Record
    per_line: int
    render: Callable[[int, list[tuple[str, ...]]], list[str]]
    verb: str = "translated"
    unit: str = "lines"
    counted: Counted | None = None


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
