"""Corpus jobs run (`run_job`: here, or spread over torchrun's processes), and the one that
translates (`translation_job`): corpus.py says what a corpus job writes and how it resumes.

    mtx translate --checkpoint T.pt --input train.en --output train.teacher.de [--resume]
    torchrun --nproc_per_node=8 -m mtx translate ... --resume     # shards.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from mtx.errors import MtxError
from mtx.jobs import shards
from mtx.jobs.corpus import CorpusJob, Done, Record, run_alone


def run_job(job: CorpusJob, output: Path, resume: bool = False, chunk_lines: int = 512) -> Done:
    """`job` into `output`, resuming it if asked: under torchrun, spread over its processes
    (shards.py), as is a job whose processes left parts beside the output; else here."""
    for path in job.inputs:
        if not path.is_file():
            raise MtxError(f"file not found: {path}")
    if chunk_lines < 1:
        raise MtxError(f"--chunk-lines must be at least 1, got {chunk_lines}")
    if shards.wanted(output):
        return shards.run(job, output, resume, chunk_lines)
    return run_alone(job, output, resume, chunk_lines)


def translation_job(out, input: Path, record: Record, items=None) -> CorpusJob:
    """Translating `input` with `out.translator` under `out.options` (`out(line number,
    translation)` makes an input line's output text: cli/lines.py); `items(lines, first line
    number)` turns lines into what the translator takes (a `Line` with controls:
    decode/controls.py), if given."""
    translator, options = out.translator, out.options

    def render(first: int, rows: list[tuple[str, ...]]) -> list[str]:
        lines = [row[0] for row in rows]
        got = list(items(lines, first)) if items is not None else lines
        done = translator.translate(got, options, first)
        return [out(first + i, translation) for i, translation in enumerate(done)]

    per_line = 1 if out.json_lines else options.nbest  # JSON: a line each
    return CorpusJob([input], record, per_line, render, counted=translator.stats)


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
    the lines translated by this call (`translation_job` says what `out` and `items` are)."""
    if not input.is_file():
        raise MtxError(f"file not found: {input}")
    return run_job(translation_job(out, input, record, items), output, resume, chunk_lines).lines
