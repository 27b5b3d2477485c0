"""Data-parallel training through torchrun: 2 CPU processes (gloo) train exactly as 1 process
accumulating 2 batches per update, and a process that dies takes the job down with it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml
from conftest import run_config

from mtx.train import checkpoint
from mtx.train.trainer import train

STEPS = 8
SAME = ["model.dropout=0.0", "train.threads=1", "train.valid_every=4", "train.log_every=2"]


def torchrun(nproc: int, cfg, **kwargs) -> subprocess.Popen:
    """`torchrun --nproc_per_node=N -m mtx train --config RUN/job.yaml` for the config `cfg`."""
    config = Path(cfg.run_dir) / "job.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", "-m", "mtx", "train", "--config", str(config)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def records(run, kind):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_two_processes_train_as_one_with_twice_the_update_freq(tmp_path, prepared):
    one, two = tmp_path / "one", tmp_path / "two"
    threads = torch.get_num_threads()
    try:
        train(
            run_config(one, prepared, f"train.max_steps={STEPS}", "train.update_freq=2", *SAME),
            log=lambda *_: None,
        )
    finally:
        torch.set_num_threads(threads)  # train.threads=1 must not leak into later tests
    job = torchrun(2, run_config(two, prepared, f"train.max_steps={STEPS}", *SAME))
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-3000:]

    a = checkpoint.load(one / "checkpoints" / "last.pt")
    b = checkpoint.load(two / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == STEPS
    assert a["batch"] == b["batch"]  # the same position in the data order
    worst = max((b["model"][k] - v).abs().max().item() for k, v in a["model"].items())
    print(f"largest parameter difference: {worst:.2e}")
    assert worst <= 1e-5
    assert len(b["process_rngs"]) == 2
    # Losses and token counts are summed over both processes before they are logged, and the
    # validation is split between them and added up: the records match the single process.
    for kind, keys in [("train", ["loss", "nll"]), ("valid", ["valid_loss", "valid_nll"])]:
        ra, rb = records(one, kind), records(two, kind)
        assert [r["step"] for r in ra] == [r["step"] for r in rb]  # written once, by rank 0
        for x, y in zip(ra, rb):
            for key in keys:
                assert abs(x[key] - y[key]) < 1e-5, (kind, key, x, y)
    assert all(0 < r["padding"] < 1 for r in records(two, "train"))
    assert "2 processes" in err


def test_a_process_that_dies_ends_the_job_with_an_error(tmp_path, prepared):
    run = tmp_path / "r"
    cfg = run_config(run, prepared, "train.max_steps=100000", *SAME)
    job = torchrun(2, cfg, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").is_file() or not records(run, "train"):
            assert job.poll() is None, job.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        workers = subprocess.run(
            ["pgrep", "-P", str(job.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(workers) == 2
        os.kill(int(workers[-1]), signal.SIGKILL)
        killed = time.monotonic()
        job.wait(timeout=90)  # a hang fails here
        print(f"the job ended {time.monotonic() - killed:.1f} s after the kill")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    assert "SIGKILL" in job.stderr.read()  # torchrun names the process that failed
