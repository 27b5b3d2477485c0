"""How fast a torchrun job reacts to a worker that dies: the seconds from a SIGKILL of rank 1
to the job's exit (no restarts), and to the first update of the job torchrun restarts
(`--max-restarts=1 ... mtx train --resume`), which resumes from rank 0's newest checkpoint.

    python scripts/bench_elastic.py [--nproc 2] [--repeat 3] [--config configs/toy.yaml]

Each process runs in its own directory with its own copy of the prepared data, as on
machines with their own disks; CPU processes (gloo), one thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(work: Path, nproc: int, config: str, restarts: int) -> subprocess.Popen:
    script = f'cd "{work}/node$LOCAL_RANK" && exec "{sys.executable}" -m mtx "$@"'
    sets = ["train.max_steps=1000000", "train.log_every=1", "train.valid_every=20"]
    sets += ["train.threads=1", "train.workers=0", "run_dir=run"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", f"--max-restarts={restarts}", "--monitor-interval=0.1"]
    cmd += ["--no-python", "sh", "-c", script, "sh", "train", "--config", config, "--resume"]
    cmd += [x for s in sets for x in ("--set", s)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def train_records(metrics: Path) -> list[dict]:
    try:
        lines = metrics.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return []
    complete = [json.loads(line) for line in lines if line.endswith("\n")]  # being written
    return [r for r in complete if r.get("kind") == "train"]


def wait_for(condition, job: subprocess.Popen, what: str, limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if job.poll() is not None:
            raise SystemExit(f"the job ended (exit {job.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} in {limit} s")
        time.sleep(0.01)


def rank1(job: subprocess.Popen, nproc: int) -> int:
    workers = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True)
    pids = workers.stdout.split()
    assert len(pids) == nproc, pids
    return int(pids[1])  # torchrun starts the workers in rank order


def one_trial(work: Path, nproc: int, config: str, restarts: int) -> float:
    """Seconds from the SIGKILL of rank 1 to the job's exit (restarts 0), or to the first
    update after the restart (restarts 1)."""
    run = work / "node0" / "run"
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    (run / "metrics.jsonl").unlink(missing_ok=True)
    job = launch(work, nproc, config, restarts)
    try:
        # past the first checkpoint (step 20), so that the restart resumes from it
        wait_for(
            lambda: any(r["step"] > 21 for r in train_records(run / "metrics.jsonl")),
            job,
            "step 22",
        )
        os.kill(rank1(job, nproc), signal.SIGKILL)
        killed = time.monotonic()
        if restarts == 0:
            job.wait(timeout=300)
            return time.monotonic() - killed
        inode = (run / "metrics.jsonl").stat().st_ino  # the resumed run truncates (replaces) it

        def resumed_and_stepped() -> bool:
            path = run / "metrics.jsonl"
            if not path.exists() or path.stat().st_ino == inode:
                return False
            records = train_records(path)
            return bool(records) and records[-1]["step"] > 20

        wait_for(resumed_and_stepped, job, "update after the restart")
        return time.monotonic() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--config", default=str(ROOT / "configs" / "toy.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prep = ["mtx", "prepare", "--config", args.config, "--set", "run_dir=" + str(work / "p")]
        subprocess.run([sys.executable, "-m", *prep], check=True, capture_output=True)
        for rank in range(args.nproc):
            shutil.copytree(work / "p" / "prepared", work / f"node{rank}" / "run" / "prepared")
        for restarts, label in [
            (0, "to the job's exit"),
            (1, "to the restarted job's first update"),
        ]:
            times = [one_trial(work, args.nproc, args.config, restarts) for _ in range(args.repeat)]
            shown = ", ".join(f"{t:.1f}" for t in times)
            print(f"SIGKILL of rank 1 {label}: median {statistics.median(times):.1f} s ({shown})")


if __name__ == "__main__":
    main()
