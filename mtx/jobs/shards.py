"""A corpus job (translate.py's `CorpusJob`: translation, scoring, distillation) spread over the
processes torchrun starts, on one machine or several, resumable, and merged into the file one
process would have written.

    torchrun --nproc_per_node=8 -m mtx translate --checkpoint T.pt --input big.en \
        --output big.de --resume

1. Every process checks that its copy of the inputs is rank 0's (size, lines, sha256) and
   lists the blocks of output its disk holds in OUTPUT.parts/ (each process appends to a part
   file of its own: NAME.txt the outputs, NAME.idx a header naming the job, then one
   'FIRST LINES OFFSET SIZE' line per block, written once the block's text is synced; so a
   kill leaves whole blocks and a tail that no index line names). Rank 0 also counts the
   complete lines of an OUTPUT that one process began.
2. Rank 0 finds which lines no block holds and cuts them into chunks of --chunk-lines, the
   longest (in bytes) first, and sends the list to every process. Each process takes the next
   chunk from a counter in torchrun's store (an atomic add: no chunk is taken twice, and a
   fast process takes more), computes it and appends it to its part, until none is left.
3. Rank 0 writes OUTPUT: each block in input order, read from its own disk or received from
   the process whose disk holds it (over gloo, whatever the device: what travels is text),
   checks that every line is there, and renames it into place; then every process removes its
   parts. Since a line's output depends on that line alone (decode/translator.py, score.py),
   OUTPUT is byte for byte one process's, whatever the processes, chunks and restarts.

A process killed (kill -9, a lost machine) loses at most the chunk it was computing: torchrun's
restart (--max-restarts) or the same command with --resume lists the blocks again and computes
only the missing lines. Every decision all processes take alike (the chunks, who sends which
block, whether to begin or refuse) comes from rank 0 (`Dist.decide`, `broadcast`) or from the
store's counter, never from a process's own look at its disk: only what each disk holds is
each process's own, and rank 0 hears it through a gather.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as torch_dist

from mtx.data.sources import lines_at
from mtx.distributed import Dist, attempt_store, joined, under_torchrun
from mtx.errors import MtxError
from mtx.jobs.corpus import CorpusJob, Done, check_record, checked, complete
from mtx.progress import Progress

TIMEOUT_S = 1800.0  # a collective (the start, the merge) that waits this long fails
POLL_S = 0.2  # how often a process that has finished looks whether the others have
OUTPUT = ""  # a Block's file: OUTPUT itself (rank 0's, begun by one process)


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def wanted(output: Path) -> bool:
    """Whether the job runs here: under torchrun, or continuing a torchrun job's parts."""
    return under_torchrun() or parts_dir(output).is_dir()


@dataclass(frozen=True)
class Block:
    """Output lines `first` to `first + lines` (input line numbers from 0), `size` bytes at
    `offset` of a part file (`file`, a name in OUTPUT.parts/; OUTPUT: the output itself)."""

    first: int
    lines: int
    file: str
    offset: int
    size: int


class Part:
    """This process's part file of this attempt: NAME.txt and NAME.idx (the module says)."""

    def __init__(self, directory: Path, name: str, job_id: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.text = open(directory / f"{name}.txt", "ab")
        self.index = open(directory / f"{name}.idx", "ab")
        self._write(self.index, json.dumps({"job": job_id}).encode() + b"\n")

    def add(self, first: int, texts: list[str]) -> int:
        """The outputs of input lines `first` on, appended and synced; returns the lines."""
        data = "".join(texts).encode("utf-8")
        offset = self.text.tell()
        self._write(self.text, data)
        self._write(self.index, f"{first} {len(texts)} {offset} {len(data)}\n".encode())
        return len(texts)

    @staticmethod
    def _write(f, data: bytes) -> None:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    def close(self) -> None:
        self.text.close()
        self.index.close()


def scan(directory: Path, job_id: str) -> list[Block]:
    """The whole blocks of every part file in `directory`; a part of another job is refused."""
    blocks: list[Block] = []
    if not directory.is_dir():
        return blocks
    for index in sorted(directory.glob("*.idx")):
        text = index.with_suffix(".txt")
        lines = index.read_bytes().split(b"\n")[:-1]  # complete lines only
        if not lines or not text.is_file():
            continue  # killed before its header: it holds nothing
        if json.loads(lines[0]).get("job") != job_id:
            raise MtxError(
                f"{text} is part of another job (other inputs, model or settings): remove "
                f"{directory} to begin again"
            )
        size = text.stat().st_size
        for line in lines[1:]:
            first, n, offset, length = map(int, line.split())
            if offset + length <= size:
                blocks.append(Block(first, n, text.stem, offset, length))
    return blocks


def cover(
    held: list[list[Block]], total: int
) -> tuple[list[tuple[int, Block]], list[tuple[int, int]]]:
    """From the blocks each process holds (`held[rank]`): the blocks that make the output, in
    order, each with the process that reads it (rank 0 where it sees the file, else the
    lowest that does), and the line ranges (start, end) that none holds."""
    seen: dict[tuple[str, int], int] = {}  # a file seen by several processes: a shared disk
    for rank, blocks in enumerate(held):
        for b in blocks:
            seen.setdefault((b.file, b.offset), rank)
    candidates = sorted(
        set(b for blocks in held for b in blocks), key=lambda b: (b.first, -b.lines)
    )
    chosen, gaps, end = [], [], 0
    for b in candidates:
        if b.first < end or b.first + b.lines > total:
            continue  # overlaps a block taken already (an earlier attempt's chunks)
        if b.first > end:
            gaps.append((end, b.first))
        chosen.append((seen[(b.file, b.offset)], b))
        end = b.first + b.lines
    if end < total:
        gaps.append((end, total))
    return chosen, gaps


def fingerprint(path: Path) -> dict:
    """What must be the same in every process's copy of an input: size, lines, sha256."""
    digest, lines, last = hashlib.sha256(), 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return {
        "bytes": path.stat().st_size,
        "lines": lines + (last != b"\n"),
        "sha256": digest.hexdigest(),
    }


def offsets(path: Path, wanted_lines: list[int]) -> dict[int, int]:
    """The byte offset at which each of `wanted_lines` (numbers from 0) begins in `path`."""
    todo = sorted(set(wanted_lines))
    out: dict[int, int] = {}
    line, position, k = 0, 0, 0
    with open(path, "rb") as f:
        while k < len(todo) and todo[k] == 0:
            out[0], k = 0, k + 1
        while k < len(todo) and (chunk := f.read(1 << 20)):
            start = 0
            while k < len(todo):
                need = todo[k] - line  # newlines to pass before that line begins
                found = _nth_newline(chunk, start, need)
                if found is None:
                    line += chunk.count(b"\n", start)
                    break
                line, start = todo[k], found + 1
                out[todo[k]], k = position + start, k + 1
            position += len(chunk)
    return out


def _nth_newline(chunk: bytes, start: int, n: int) -> int | None:
    """Where the n-th newline from `start` is in `chunk` (start - 1 for n = 0), or None."""
    position = start - 1
    for _ in range(n):
        position = chunk.find(b"\n", position + 1)
        if position < 0:
            return None
    return position


def check_inputs(dist: Dist, job: CorpusJob) -> int:
    """Every process's inputs and checkpoints are rank 0's (one line on every process if
    not); the inputs' lines."""
    files = [*job.inputs, *map(Path, job.record.checkpoints)]
    every = dist.each(lambda: [fingerprint(p) for p in files])
    for rank, theirs in enumerate(every):
        for path, a, b in zip(files, theirs, every[0]):
            if a != b:
                raise MtxError(
                    f"process {rank}'s {path} differs from process 0's ({a['bytes']:,} bytes, "
                    f"sha256 {a['sha256'][:12]}; process 0's: {b['bytes']:,}, "
                    f"{b['sha256'][:12]}): copy the same files to every machine"
                )
    counts = [f["lines"] for f in every[0]]
    for path, n in zip(job.inputs[1:], counts[1:]):
        if n != counts[0]:
            raise MtxError(
                f"{job.inputs[0]} has {counts[0]} lines but {path} has {n}: they must pair up"
            )
    return counts[0]


def begin(output: Path, job: CorpusJob, resume: bool, total: int) -> tuple[bool, Block | None, str]:
    """Rank 0: whether the job may begin or go on (refused in one line otherwise), whether
    `output` is finished, the block of an `output` that one process began (its complete
    lines), and the job's name in the parts (a hash of rank 0's record)."""
    begun = output.exists() or parts_dir(output).is_dir()
    if begun and not resume:
        there = output if output.exists() else parts_dir(output)
        raise MtxError(f"{there} exists: --resume continues it, or remove it first")
    check_record(output, job.record, begun)
    job_id = hashlib.sha256(json.dumps([asdict(job.record), job.per_line]).encode())
    if not output.exists():
        return False, None, job_id.hexdigest()[:16]
    lines = complete(output, job.per_line)
    block = Block(0, lines, OUTPUT, 0, output.stat().st_size) if lines else None
    return lines == total, block, job_id.hexdigest()[:16]


def run(job: CorpusJob, output: Path, resume: bool, chunk_lines: int) -> Done:
    """`job` into `output` over torchrun's processes (or this one alone, continuing their
    parts); the module says how."""
    with joined(torch.device("cpu"), TIMEOUT_S, backend="gloo") as dist:
        return _run(dist, job, output, resume, chunk_lines)


def _run(dist: Dist, job: CorpusJob, output: Path, resume: bool, chunk_lines: int) -> Done:
    resume, chunk_lines = dist.broadcast((resume, chunk_lines))  # rank 0's
    total = check_inputs(dist, job)
    finished, begun, job_id = dist.decide(lambda: begin(output, job, resume, total))
    directory = parts_dir(output)
    if finished:  # a merge killed before every process removed its parts
        shutil.rmtree(directory, ignore_errors=True)
        return Done(0, dist.main, dist.world, total)
    held = dist.each(lambda: scan(directory, job_id))
    if not resume and any(held):
        rank = next(r for r, blocks in enumerate(held) if blocks)
        raise MtxError(f"process {rank}'s {directory} holds an earlier run's parts: --resume "
                       "continues it, or remove them")  # fmt: skip
    if begun:  # one process began the output: its complete lines are a block rank 0 holds
        held[0].append(begun)
    plan, token = dist.decide(
        lambda: (chunked(job.inputs[0], cover(held, total)[1], chunk_lines), uuid.uuid4().hex[:12])
    )
    before = total - sum(n for _, n in plan)
    part = Part(directory, f"{token}-{dist.rank}", job_id)
    try:
        work(dist, job, plan, part, Counters(dist, token), (before, total))
    finally:
        part.close()
    held = dist.each(lambda: scan(directory, job_id))
    if begun:
        held[0].append(begun)
    started = time.perf_counter()
    merge(dist, output, held, total, job.per_line)
    merged = (output.stat().st_size if dist.main else 0, time.perf_counter() - started)
    add_counts(dist, job)
    dist.broadcast(None)  # the output is in place: the parts may go
    shutil.rmtree(directory, ignore_errors=True)
    return Done(total - before, dist.main, dist.world, before, merged)


def chunked(path: Path, gaps: list[tuple[int, int]], chunk_lines: int) -> list[tuple[int, int]]:
    """The chunks (first line, lines) that fill `gaps`, the longest in bytes of `path` first
    (so that the last ones, which processes finish at different times, are short)."""
    cuts = [
        (s, min(chunk_lines, end - s))
        for start, end in gaps
        for s in range(start, end, chunk_lines)
    ]
    where = offsets(path, [f for f, _ in cuts] + [f + n for f, n in cuts])
    size = path.stat().st_size
    return sorted(cuts, key=lambda c: (where[c[0]] - where.get(c[0] + c[1], size), c[0]))


class Counters:
    """What every process adds to (atomically, in torchrun's store; here alone, in this
    process): the chunks taken, the lines done, the processes finished."""

    TAKEN, LINES, FINISHED = "taken", "lines", "finished"  # their keys in the store

    def __init__(self, dist: Dist, token: str) -> None:
        self.store = attempt_store("corpus", timedelta(seconds=60)) if dist.enabled else None
        self.token, self.local = token, {}

    def take(self) -> int:
        """The index of the next chunk of the plan for this process (past the end: none left)."""
        return self._add(self.TAKEN, 1) - 1

    def done(self, lines: int = 0) -> int:
        """Add `lines` done by this process; the lines done by all of them (0: read them)."""
        return self._add(self.LINES, lines)

    def finish(self) -> None:
        """This process has taken its last chunk."""
        self._add(self.FINISHED, 1)

    def finished(self) -> int:
        """The processes that have taken their last chunk."""
        return self._add(self.FINISHED, 0)

    def _add(self, key: str, n: int) -> int:
        if self.store is not None:
            return self.store.add(f"{self.token}/{key}", n)
        self.local[key] = self.local.get(key, 0) + n
        return self.local[key]


def work(dist: Dist, job: CorpusJob, plan, part: Part, counters: Counters, span) -> None:
    """Take the plan's chunks one by one until none is left, each into `part`; rank 0 shows
    the whole job's progress (`span`: lines done before, lines in all) until all are done."""
    before, total = span
    starts = {path: offsets(path, [first for first, _ in plan]) for path in job.inputs}
    bar = Progress(total, job.verb, job.unit, initial=before) if dist.main else None
    while (taken := counters.take()) < len(plan):
        first, n = plan[taken]
        rows = list(zip(*(lines_at(p, starts[p][first], n, first) for p in job.inputs)))
        part.add(first, checked(job, first, rows))
        done = counters.done(n)
        if bar is not None:
            bar.update(before + done - bar.done)
    counters.finish()
    while counters.finished() < dist.world:  # the others' last chunks
        time.sleep(POLL_S)
        if bar is not None:
            bar.update(before + counters.done() - bar.done)
    if bar is not None:
        bar.close()


def merge(dist: Dist, output: Path, held: list[list[Block]], total: int, per_line: int) -> None:
    """Rank 0 writes `output` from the blocks, in order, each read from its disk or sent by the
    process that holds it; every line checked there before it takes the output's place."""
    chosen, gaps = cover(held, total)  # the same on every process: from a collective
    if gaps:
        raise MtxError(f"{output}: lines {gaps[0][0] + 1} to {gaps[0][1]} are in no part")
    directory = parts_dir(output)
    if not dist.main:
        for rank, b in chosen:
            if rank == dist.rank:
                data = _read(directory / f"{b.file}.txt", b)
                torch_dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=0)
        return
    merging = output.with_name(output.name + ".merging")
    with open(merging, "wb") as f:
        for rank, b in chosen:
            if rank == 0:
                data = _read(output if b.file == OUTPUT else directory / f"{b.file}.txt", b)
            else:
                received = torch.empty(b.size, dtype=torch.uint8)
                torch_dist.recv(received, src=rank)
                data = received.numpy().tobytes()
            if data.count(b"\n") != b.lines * per_line:
                raise MtxError(f"{output}: the part holding lines {b.first + 1} on is damaged")
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(merging, output)


def _read(path: Path, b: Block) -> bytes:
    with open(path, "rb") as f:
        f.seek(b.offset)
        return f.read(b.size)


def add_counts(dist: Dist, job: CorpusJob) -> None:
    """Rank 0's `job.counted` becomes the sum of every process's (its `merge`)."""
    if job.counted is None:
        return
    every = dist.gather(job.counted)  # each process's, in rank order
    if dist.main:
        for other in every[1:]:
            job.counted.merge(other)
