"""Corpus jobs on several processes against one: `mtx translate --input --output`, `mtx score
--output` and `mtx distill` under torchrun (mtx/jobs/shards.py) beside the same job in one
process, on the same lines, outputs compared byte for byte.

    mtx bench corpus --checkpoint RUN/checkpoints/best.pt --src data/multi30k/train.en \
        [--tgt ...] [--lines 3000] [--jobs translate,score,distill] [--processes 1,2] \
        [--beam 4] [--rounds 2] [--kill] [--work DIR] [--json]

Each job runs as a user runs it, in a subprocess: with 1 process, `python -m mtx ...`; with N,
`torchrun --standalone --nproc_per_node=N -m mtx ...`; every process with one thread
(OMP_NUM_THREADS=1, as torchrun sets it), so N processes use N cores. The process counts of a
job alternate in order from round to round (a busy spell slows each alike); the harness's
timer times each whole command, start-up included (the median counts). Reported: seconds,
lines per second, the speed over one process's; the job's own rate once at work (its last
progress line: lines over the time from the first chunk to the last process's end, which
leaves out the start-up that a long job pays once) and its speed over one process's; the
seconds rank 0 spent merging the parts (from the job's summary line); and whether every
output is byte-identical to one process's. With --kill, one more run of each job on the largest process count under
torchrun --max-restarts=1 with --resume, whose rank 1 is sent SIGKILL once its part holds a
whole block: the output must still be byte-identical.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtx.bench.harness import describe_machine, result, timed, tree
from mtx.errors import MtxError

JOBS = ("translate", "score", "distill")


@dataclass
class Options:
    """What `mtx bench corpus` is asked for (its flags)."""

    checkpoint: Path
    src: Path
    tgt: Path | None = None  # score's targets and distill's references (default: beside --src)
    lines: int = 3000  # the first N lines (0: all)
    jobs: list[str] = field(default_factory=lambda: list(JOBS))
    processes: list[int] = field(default_factory=lambda: [1, 2])
    beam: int = 4
    rounds: int = 2
    kill: bool = False
    work: Path = Path("/tmp/bench_corpus")
    json_out: bool = False


def inputs(o: Options) -> tuple[Path, Path]:
    """The first --lines of --src and of its targets, in the work directory."""
    from mtx.config import load_config

    tgt = o.tgt
    if tgt is None:
        config = load_config(o.checkpoint.parent.parent / "config.yaml", [])
        tgt = o.src.with_suffix(f".{config.data.tgt_lang}")
    for path in (o.src, tgt):
        if not path.is_file():
            raise MtxError(f"file not found: {path}")
    o.work.mkdir(parents=True, exist_ok=True)
    out = []
    for path, name in ((o.src, "in.src"), (tgt, "in.tgt")):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        (o.work / name).write_text("".join(lines[: o.lines] if o.lines else lines))
        out.append(o.work / name)
    return out[0], out[1]


def arguments(job: str, o: Options, src: Path, tgt: Path, where: Path) -> list[str]:
    """The job's `mtx` arguments, writing into `where`."""
    model = ["--checkpoint", str(o.checkpoint.resolve()), "--device", "cpu"]
    if job == "translate":
        out = ["--input", str(src), "--output", str(where / "out.txt")]
        return ["translate", *model, "--beam", str(o.beam), *out]
    if job == "score":
        return [
            "score",
            *model,
            "--src",
            str(src),
            "--tgt",
            str(tgt),
            "--output",
            str(where / "scores.txt"),
        ]
    out = ["--src", str(src), "--output-dir", str(where / "distilled")]
    return ["distill", *model, "--beam", str(o.beam), *out]


def command(args: list[str], processes: int, kill: bool = False) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "mtx", *args]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
    ]
    cmd += ["--monitor-interval=0.1"] + (["--max-restarts=1"] if kill else [])
    return [*cmd, "-m", "mtx", *args] + (["--resume"] if kill else [])


def once(job: str, o: Options, files, processes: int, where: Path, kill: bool = False) -> dict:
    """One run of `job` on `processes` processes into a fresh `where`: its summary line."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    args = arguments(job, o, *files, where)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command(args, processes, kill), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    killer = threading.Thread(target=kill_rank_1, args=(proc, where), daemon=True) if kill else None
    if killer:
        killer.start()
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"mtx {job} on {processes} processes failed: {err[-3000:]}")
    merged = re.search(r"merged [\d.,]+ MB in ([\d.]+) s", err)
    rates = re.findall(r"\(100%\), ([\d,.]+) \w+/s", err)  # the job's own, once at work
    return {
        "merge_s": float(merged.group(1)) if merged else 0.0,
        "working_per_s": float(rates[-1].replace(",", "")) if rates else 0.0,
        "killed": "exitcode: -9" in err,
    }


def kill_rank_1(proc: subprocess.Popen, where: Path) -> None:
    """SIGKILL the worker whose RANK is 1 once a part index in `where` names a whole block."""
    while proc.poll() is None:
        blocks = [i for i in where.rglob("*.parts/*-1.idx") if i.read_bytes().count(b"\n") >= 2]
        for pid in tree(proc.pid) if blocks else []:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"RANK=1" in environ and b"TORCHELASTIC_RESTART_COUNT=0" in environ:
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.05)


def same(a: Path, b: Path) -> bool:
    """Whether every file a job wrote in `a` is byte-identical to the one in `b` (the paths
    distill.json names, which are each run's own, left out; records and parts skipped)."""
    for path in sorted(a.rglob("*")):
        other = b / path.relative_to(a)
        if path.is_dir() or path.name.endswith(".progress.json"):
            continue
        if not other.is_file():
            return False
        if path.name == "distill.json":
            ours, theirs = json.loads(path.read_text()), json.loads(other.read_text())
            for key in ("translations", "corpus"):
                ours.pop(key), theirs.pop(key)
            if ours != theirs:
                return False
        elif path.read_bytes() != other.read_bytes():
            return False
    return True


def timed_once(job: str, o: Options, files, n: int, where: Path, kill: bool = False):
    """The harness's seconds of one run (`once`), and its summary."""
    timing, said = timed(functools.partial(once, job, o, files, n, where, kill), 1, warmup=0)
    return timing.median, said


def bench_job(job: str, o: Options, files, lines: int) -> dict[str, dict]:
    """The job on each process count, --rounds times in alternating order; with --kill, once
    more on the largest count, rank 1 killed."""
    runs: dict[int, list] = {n: [] for n in o.processes}
    for r in range(o.rounds):
        for n in o.processes[:: 1 if r % 2 == 0 else -1]:
            runs[n].append(timed_once(job, o, files, n, o.work / job / f"p{n}"))
    first = o.work / job / f"p{o.processes[0]}"
    base = sorted(s for s, _ in runs[o.processes[0]])[o.rounds // 2]
    working = sorted(said["working_per_s"] for _, said in runs[o.processes[0]])[o.rounds // 2]
    out = {}
    for n, got in runs.items():
        median = sorted(s for s, _ in got)[o.rounds // 2]
        rate = sorted(said["working_per_s"] for _, said in got)[o.rounds // 2]
        out[f"{job}, {n} process{'es' if n > 1 else ''}"] = {
            "seconds": median, "lines_per_s": lines / median, "speed": base / median,
            "working_per_s": rate, "working_speed": rate / working if working else 0.0,
            "merge_s": max(said["merge_s"] for _, said in got),
            "same": same(first, o.work / job / f"p{n}"),
        }  # fmt: skip
    if o.kill:
        n, where = max(o.processes), o.work / job / "killed"
        seconds, said = timed_once(job, o, files, n, where, kill=True)
        killed = "rank 1 killed and restarted" if said["killed"] else "the kill came too late"
        out[f"{job}, {n} processes, {killed}"] = {
            "seconds": seconds, "lines_per_s": lines / seconds, "speed": base / seconds,
            "working_per_s": said["working_per_s"],
            "working_speed": said["working_per_s"] / working if working else 0.0,
            "merge_s": said["merge_s"], "same": same(first, where), "killed": said["killed"],
        }  # fmt: skip
    return out


def bench(o: Options) -> dict:
    files = inputs(o)
    lines = sum(1 for _ in open(files[0], "rb"))
    figures: dict[str, dict] = {}
    for job in o.jobs:
        figures |= bench_job(job, o, files, lines)
    return {"lines": lines, "jobs": figures}


def table(r: dict) -> str:
    s = r["settings"]
    out = [
        f"{describe_machine(r['machine'])}; {r['lines']:,} lines, beam {s['beam']}, 1 thread a process",
        "",
        "| job | seconds (median) | lines/s | over 1 process | working lines/s | over 1 process "
        "| merge s | byte-identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, f in r["jobs"].items():
        same = "yes" if f["same"] else "**no**"
        working = (  # a restart that found nothing left to do has no rate of its own
            f"{f['working_per_s']:,.1f} | {f['working_speed']:.2f}x"
            if f["working_per_s"]
            else "- | -"
        )
        out.append(
            f"| {name} | {f['seconds']:.1f} | {f['lines_per_s']:,.1f} | {f['speed']:.2f}x | "
            f"{working} | {f['merge_s']:.2f} | {same} |"
        )
    return "\n".join(out)


def run(o: Options) -> str:
    unknown = [j for j in o.jobs if j not in JOBS]
    if unknown:
        raise MtxError(f"--jobs: unknown {', '.join(unknown)} (known: {', '.join(JOBS)})")
    r = result("corpus", bench(o), **{k: str(v) for k, v in asdict(o).items()})
    return json.dumps(r) if o.json_out else table(r)
