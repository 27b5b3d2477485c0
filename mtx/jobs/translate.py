"""Translating a whole corpus into a file that lines up with it, and resuming after a kill.

    mtx translate --checkpoint T.pt --input train.en --output train.teacher.de [--resume]

The output holds one line per input line (with --nbest N, N lines 'LINE ||| TEXT ||| SCORE |||
LOG-PROBABILITY' per input line, LINE counted from 0 over the whole input), written chunk by
chunk, each chunk flushed to disk before the next is translated, with its progress on stderr
(mtx/progress.py: a bar on a terminal, plain lines in a log). Beside it, OUTPUT.progress.json records what the run translates (the input's path
and size, the checkpoints, the settings, nbest).

`--resume` continues a killed run: the output's complete lines are kept (an input line counts
when all its N lines end in a newline), whatever a kill left after them is cut, those input
lines are skipped, and translation goes on from the next. Since a line's translation depends
on that line alone (decode/translator.py: not on its batch, its neighbours or, with sampling, on
anything but the seed and its line number), the continued file is the same, line for line, as
one written without interruption (tested with kill -9). Resuming a finished run translates
nothing more; resuming with another input, checkpoint, setting or nbest than the record says
is refused in one line.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from mtx.data.sources import count_lines, read_lines
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
    saved = Record.path(output)
    if output.exists() and not resume:
        raise MtxError(f"{output} exists: --resume continues it, or remove it first")
    if not output.exists():
        atomic_write_text(saved, json.dumps(asdict(record), indent=1) + "\n")
        output.write_bytes(b"")
        return 0
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
    return complete(output, per_line or record.nbest)


def translate_corpus(
    out,
    input: Path,
    output: Path,
    record: Record,
    resume: bool = False,
    chunk_lines: int = 512,
    items: Callable[[Iterable[str], int], Iterable] | None = None,
) -> int:
    """Translate `input` into `output` (resuming it if asked) with `out.translator`; returns
    the lines translated by this call. `out(line number, hypotheses, item)` makes an input
    line's output text; `items(lines, first line number)` turns the input's lines into what
    the translator takes (a `Line` with controls: decode/controls.py), if given."""
    if not input.is_file():
        raise MtxError(f"file not found: {input}")
    nbest, translator = record.nbest, out.translator
    translator.check_nbest(nbest)
    translator.check_language()
    total = count_lines(input)
    done = start(output, record, resume, 1 if out.json_lines else nbest)  # JSON: a line each
    lines: Iterable = itertools.islice(read_lines(input), done, None)
    if items is not None:
        lines = items(lines, done)
    read: deque = deque()  # the items read and not yet written
    stream = out.stream(_kept(lines, read), chunk_lines, None, done)
    written = 0
    with open(output, "ab") as f, Progress(total, "translated", "lines", initial=done) as bar:
        pending: list[str] = []
        for number, hyps in enumerate(stream, start=done):
            pending.append(out(number, hyps, read.popleft()))
            if len(pending) == chunk_lines:
                flush(f, pending)
                bar.update(len(pending))
                written, pending = written + len(pending), []
        flush(f, pending)
        bar.update(len(pending))
        written += len(pending)
    return written


def _kept(items: Iterable, read: deque) -> Iterator:
    for item in items:
        read.append(item)
        yield item


def flush(f, texts: list[str]) -> None:
    """One chunk's outputs to disk: written, flushed and synced before the next chunk."""
    if texts:
        f.write("".join(texts).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
