"""Training through torchrun on CPU processes (gloo), as on several machines: each process in its
own directory with its own copy of the prepared data (as machines with their own disks), or
all in one (a shared disk).

- 2 processes train exactly as 1 process accumulating 2 batches per update (bit-identical);
- only rank 0 writes the run's files, and the job resumes, stops and restarts from them alone;
- the moving average of the weights (train.ema) too, resumed exactly;
- a worker SIGKILLed at a random step, with torchrun's --max-restarts, ends like an
  uninterrupted job;
- different prepared data, a dead process and a hung process end the job with one line.
"""

import gc
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from conftest import BOTH_WAYS, TINY_RUN, run_config
from helpers.common import assert_same_parameters, last, records
from torch.nn.parallel import DistributedDataParallel

from mtx import distributed
from mtx.checkpoint import RunDir
from mtx.config import load_config
from mtx.data.prepare import prepare
from mtx.train.trainer import train

SAME = ["model.dropout=0.0", "train.threads=1", "train.valid_every=4", "train.log_every=2"]
HELPERS = Path(__file__).parent / "helpers"


def job_config(root: Path, prepared: Path, *extra: str, shared: bool = False) -> Path:
    """root/job.yaml for TINY_RUN plus `extra`; run_dir is root/run on a shared disk, else the
    relative `run`, which each process finds in its own root/nodeR/ with its own copy of the
    prepared data."""
    root.mkdir(parents=True, exist_ok=True)
    for node in ["."] if shared else ["node0", "node1"]:
        if not (root / node / "run" / "prepared").exists():
            shutil.copytree(prepared, root / node / "run" / "prepared")
    run_dir = str(root / "run") if shared else "run"
    cfg = load_config(None, [f"run_dir={run_dir}", *TINY_RUN, *extra])
    (root / "job.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    return root / "job.yaml"


def torchrun(
    root: Path, *args: str, shared=False, restarts=0, program=("-m", "mtx"), env=None, **popen
):
    """torchrun with 2 processes running `python PROGRAM train --config root/job.yaml ARGS`,
    each in root/node$LOCAL_RANK unless `shared`."""
    where = "." if shared else "node$LOCAL_RANK"
    script = f'cd "{root}/{where}" && exec "$PYTHON" "$@"'
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [f"--max-restarts={restarts}", "--monitor-interval=0.1", "--no-python"]
    cmd += ["sh", "-c", script, "sh", *program, "train", "--config", str(root / "job.yaml"), *args]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHON": sys.executable} | (env or {})
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


def finish(job: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = job.communicate(timeout=timeout)
    return job.returncode, err


def run_dir(root: Path, node: int = 0) -> Path:
    return root / f"node{node}" / "run"


def assert_rank1_wrote_nothing(root: Path) -> None:
    assert sorted(p.name for p in run_dir(root, 1).iterdir()) == ["prepared"]


def test_two_machines_with_their_own_disks_train_as_one_process(tmp_path, prepared):
    one = tmp_path / "one"
    threads = torch.get_num_threads()
    # validation BLEU on 41 lines: the processes translate 21 and 20 of them
    bleu = ["train.bleu_every=1", "train.valid_bleu_lines=41", "decode.max_len_b=8"]
    try:
        train(
            run_config(one, prepared, "train.max_steps=8", "train.update_freq=2", *SAME, *bleu),
            log=lambda *_: None,
        )
    finally:
        torch.set_num_threads(threads)  # train.threads=1 must not leak into later tests
    for attempt in range(3):
        root = tmp_path / f"two{attempt}"
        job_config(root, prepared, "train.max_steps=8", *SAME, *bleu)
        code, err = finish(torchrun(root))
        assert code == 0, err[-3000:]
        two = run_dir(root)
        assert_same_parameters(one / "checkpoints" / "last.pt", two / "checkpoints" / "last.pt")
        a, b = last(one), last(two)
        assert a.position.batch == b.position.batch  # the same position in the data order
        assert len(b.resume.process_rngs) == 2
        # Losses and token counts are summed over both processes before rank 0 logs them,
        # and the validation is split between them and added up: as the single process.
        for kind, keys in [("train", ["loss", "nll"]), ("valid", ["valid_loss", "valid_nll"])]:
            ra, rb = records(one, kind), records(two, kind)
            assert [r["step"] for r in ra] == [r["step"] for r in rb]
            for x, y in zip(ra, rb):
                for key in keys:
                    assert abs(x[key] - y[key]) < 1e-6, (kind, key, x, y)
        # validation BLEU: shared translating, rank 0 scoring, the same as one process
        bleus = [
            [(r["valid_bleu"], r["valid_chrf"]) for r in records(x, "valid")] for x in (one, two)
        ]
        assert len(bleus[1]) == 2 and bleus[0] == bleus[1]
        hyps = (two / "valid.hyp").read_text().splitlines()
        assert len(hyps) == 41 and hyps == (one / "valid.hyp").read_text().splitlines()
        assert len(set(hyps)) > 1
        assert all(0 < r["padding"] < 1 for r in records(two, "train"))
        assert "2 process(es), gloo" in err
        assert_rank1_wrote_nothing(root)


@pytest.mark.slow
def test_smoothed_weights_train_on_two_machines_as_on_one_and_resume_exactly(tmp_path, prepared):
    """train.ema under torchrun: the average moves on every process alike (each averages the
    weights the all-reduce made equal), rank 0 checkpoints it with the raw weights beside it,
    and a job stopped at step 4 and resumed ends as one process that never stopped."""
    settings = ["train.ema=0.9", "train.update_freq=2", *SAME]
    one = tmp_path / "one"
    threads = torch.get_num_threads()
    try:
        train(run_config(one, prepared, "train.max_steps=8", *settings), log=lambda *_: None)
    finally:
        torch.set_num_threads(threads)
    root = tmp_path / "two"
    job_config(root, prepared, "train.max_steps=4", *settings[:1], *SAME)
    code, err = finish(torchrun(root))
    assert code == 0, err[-3000:]
    job_config(root, prepared, "train.max_steps=8", *settings[:1], *SAME)
    code, err = finish(torchrun(root, "--resume"))
    assert code == 0, err[-3000:]
    ours, theirs = one / "checkpoints", run_dir(root) / "checkpoints"
    for name in ("last.pt", "best.pt"):
        assert_same_parameters(ours / name, theirs / name)
    raw, resumed = last(one).resume.raw_model, last(run_dir(root)).resume.raw_model
    assert all(torch.equal(raw[k], resumed[k]) for k in raw)
    assert any(not torch.equal(raw[k], last(one).model[k]) for k in raw)  # an average indeed
    assert_rank1_wrote_nothing(root)


@pytest.mark.slow
def test_several_corpora_with_sampling_train_on_two_machines_as_on_one(
    tmp_path, prepared_both_ways
):
    """Both directions mixed by temperature, each pair segmented anew each epoch: every
    process draws the same rows and the same segmentations by (seed, epoch, row) alone."""
    settings = [BOTH_WAYS, "data.corpus_temperature=2", "data.bpe_dropout=0.1", *SAME]
    one = tmp_path / "one"
    threads = torch.get_num_threads()
    try:
        cfg = run_config(one, prepared_both_ways, "train.max_steps=8", "train.update_freq=2",
                         *settings)  # fmt: skip
        train(cfg, log=lambda *_: None)
    finally:
        torch.set_num_threads(threads)
    root = tmp_path / "two"
    job_config(root, prepared_both_ways, "train.max_steps=8", *settings)
    code, err = finish(torchrun(root))
    assert code == 0, err[-3000:]
    assert_same_parameters(
        one / "checkpoints" / "last.pt", run_dir(root) / "checkpoints" / "last.pt"
    )
    assert [r["valid_loss/de-en"] for r in records(one, "valid")] == pytest.approx(
        [r["valid_loss/de-en"] for r in records(run_dir(root), "valid")], abs=1e-6
    )


@pytest.mark.slow
def test_a_job_on_a_shared_disk_finishes_ten_times_in_a_row(tmp_path, prepared):
    root = tmp_path / "shared"
    job_config(root, prepared, "train.max_steps=4", "train.valid_every=2", *SAME[:2], shared=True)
    for attempt in range(10):
        code, err = finish(torchrun(root, "--overwrite", shared=True))
        assert code == 0, f"attempt {attempt}: {err[-3000:]}"
        assert last(root / "run").step == 4


@pytest.mark.slow
def test_a_job_stopped_by_sigterm_resumes_to_the_uninterrupted_parameters(tmp_path, prepared):
    """SIGTERM to torchrun mid-run (it passes it on to every worker): the workers agree to
    stop, rank 0 saves, and `--resume` continues on the checkpoint of rank 0's disk alone."""
    # Dropout on: each process's random stream must be restored too.
    settings = ["model.dropout=0.1", "train.threads=1", "train.log_every=1", "train.valid_every=5"]
    root = tmp_path / "stopped"
    job_config(root, prepared, "train.max_steps=100000", *settings)
    job = torchrun(root)
    try:
        while not (run_dir(root) / "metrics.jsonl").is_file() or not records(
            run_dir(root), "train"
        ):
            assert job.poll() is None, job.stderr.read()[-3000:]
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        code, err = finish(job, timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    # rank 0 says SIGTERM, or "a stop signal to another process" if rank 1's came first
    assert "stopped by " in err and "Resume with: mtx train" in err, err[-3000:]
    stopped = last(run_dir(root)).step
    assert 0 < stopped < 100000
    assert_rank1_wrote_nothing(root)

    end = f"train.max_steps={stopped + 4}"
    job_config(root, prepared, end, *settings)  # the same run, now bounded
    code, err = finish(torchrun(root, "--resume"))
    assert code == 0, err[-3000:]
    assert f"resuming from run/checkpoints/last.pt at step {stopped}" in err

    reference = tmp_path / "uninterrupted"
    job_config(reference, prepared, end, *settings)
    code, err = finish(torchrun(reference))
    assert code == 0, err[-3000:]
    assert_same_parameters(RunDir(run_dir(root)).last, RunDir(run_dir(reference)).last)
    assert_rank1_wrote_nothing(root)


ELASTIC = ["model.dropout=0.1", "train.threads=1", "train.valid_every=4", "train.max_steps=20"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, prepared) -> Path:
    """rank 0's last.pt of a 2-process job with the ELASTIC settings that nothing interrupts."""
    root = tmp_path_factory.mktemp("uninterrupted")
    job_config(root, prepared, *ELASTIC)
    code, err = finish(torchrun(root))
    assert code == 0, err[-3000:]
    return run_dir(root) / "checkpoints" / "last.pt"


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["own-disks", "shared-disk"])
def test_an_elastic_job_survives_a_worker_killed_at_a_random_step(
    tmp_path, prepared, uninterrupted, shared
):
    """torchrun --max-restarts=2 ... mtx train --resume: rank 1 SIGKILLs itself at a random
    step; torchrun restarts both workers, which continue from rank 0's newest checkpoint and
    end with the parameters of a job that was never interrupted (dropout on, so each
    process's random stream is restored too)."""
    die_at = random.Random().randint(1, 19)
    print(f"rank 1 dies before update {die_at + 1}")
    root = tmp_path / "elastic"
    job_config(root, prepared, *ELASTIC, shared=shared)
    die = {"MTX_DIE_AT_STEP": str(die_at), "MTX_DIE_RANK": "1"}
    program = (str(HELPERS / "die_at_step.py"),)
    job = torchrun(root, "--resume", shared=shared, restarts=2, program=program, env=die)
    code, err = finish(job)
    assert code == 0, err[-3000:]
    assert "exitcode: -9" in err or "SIGKILL" in err, err[-3000:]  # torchrun saw it die
    checkpointed = 4 * (die_at // 4)  # rank 0's newest checkpoint when rank 1 died
    if checkpointed:
        assert f"run/checkpoints/last.pt at step {checkpointed}" in err, err[-3000:]
    run = root / "run" if shared else run_dir(root)
    assert_same_parameters(run / "checkpoints" / "last.pt", uninterrupted)
    if not shared:
        assert_rank1_wrote_nothing(root)


@pytest.mark.slow  # a two-process job: the default run's one is the test of two machines above
def test_different_prepared_data_is_one_line_on_every_process(tmp_path, prepared):
    root = tmp_path / "mismatch"
    job_config(root, prepared, "train.max_steps=4", *SAME)
    other = root / "node1" / "run"
    shutil.rmtree(other / "prepared")
    prepare(load_config(None, [f"run_dir={other}", *TINY_RUN, "data.vocab_size=150"]), log=print)
    start = time.monotonic()
    code, err = finish(torchrun(root), timeout=60)
    print(f"the job ended {time.monotonic() - start:.1f} s after its start")
    assert code != 0
    lines = [line for line in err.splitlines() if line.startswith("mtx: error:")]
    assert len(lines) == 2, err[-3000:]  # one line from each process, the same
    assert lines[0] == lines[1]
    assert "process 1's prepared data differs from process 0's: spm.model sha256" in lines[0]
    assert not (run_dir(root) / "checkpoints").exists()


def start_and_wait_for_training(root: Path, *args: str) -> subprocess.Popen:
    job = torchrun(root, *args, start_new_session=True)
    while not (run_dir(root) / "metrics.jsonl").is_file() or not records(run_dir(root), "train"):
        assert job.poll() is None, job.stderr.read()[-3000:]
        time.sleep(0.05)
    return job


@pytest.mark.parametrize(
    "fault",
    # A hung process costs the test train.dist_timeout plus torchrun's 30 s grace: slow.
    # A killed worker: a multi-process loop of its own (make test-all).
    [
        pytest.param("SIGKILL", marks=pytest.mark.slow),
        pytest.param("SIGSTOP", marks=pytest.mark.slow),
    ],
    ids=["dies", "hangs"],
)
def test_a_process_that_dies_or_hangs_ends_the_job_naming_it(tmp_path, prepared, fault):
    """A dead worker is seen by the others' next collective; a hung one (SIGSTOP) by the
    collective's timeout, train.dist_timeout. Rank 0 names it from the heartbeats."""
    root = tmp_path / "r"
    job_config(root, prepared, "train.max_steps=100000", "train.dist_timeout=5", *SAME)
    job = start_and_wait_for_training(root)
    try:
        workers = subprocess.run(
            ["pgrep", "-P", str(job.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(workers) == 2
        rank1 = int(workers[-1])  # torchrun starts rank 0 first
        os.kill(rank1, getattr(signal, fault))
        killed = time.monotonic()
        # the bound: dist_timeout (5 s) + 3 heartbeats + torchrun's 30 s before it SIGKILLs
        # a process that does not end on SIGTERM (a stopped one)
        code, err = finish(job, timeout=60)
        print(f"the job ended {time.monotonic() - killed:.1f} s after the {fault}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert code != 0
    assert "mtx: error: process 0 of 2: process 1 stopped answering (died or hangs)" in err, err[
        -3000:
    ]


def test_the_heartbeat_thread_has_ended_when_stop_returns(monkeypatch):
    """A thread left inside a store call (C++, the GIL released) when the interpreter shuts
    down aborts the process (SIGABRT, "terminate called without an active exception"), and a
    finished job then exits non-zero: stop() returns only once the thread has ended."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setattr(distributed, "BEAT_S", 0.001)  # almost always inside a store call
    for _ in range(20):
        heartbeat = distributed.Heartbeat(rank=0, world=1)
        while heartbeat._counts()[0] < 3:  # beating
            time.sleep(0.001)
        heartbeat.stop()
        assert not heartbeat.thread.is_alive()


def test_the_process_group_is_released_before_train_returns(tmp_path, prepared, monkeypatch):
    """A process group that outlives train() (held by DDP in a reference cycle until the
    collector runs, perhaps while the interpreter shuts down) has its gloo threads torn down
    in the middle of finalization, which can abort a finished job (SIGABRT, "terminate called
    without an active exception"). With the collector off, nothing of DDP may be left."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for key, value in (env | {"MASTER_PORT": str(server.port)}).items():
        monkeypatch.setenv(key, value)
    cfg = run_config(tmp_path / "run", prepared, "train.max_steps=2", "train.valid_every=2")
    gc.collect()
    gc.disable()  # what is freed must be freed by its last reference going, not by chance
    try:
        train(cfg, log=lambda *_: None)
        assert not dist.is_initialized()
        left = [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]
        assert not left, "DDP (and its process group) outlived train()"
    finally:
        gc.enable()


@pytest.mark.slow
def test_a_finished_job_exits_0_fifty_times_beside_a_busy_core(tmp_path, prepared):
    """50 two-process jobs to their end, each exiting 0, while another process keeps a core
    busy; half of them with the heartbeat beating every millisecond
    (helpers/busy_heartbeat.py), so that jobs end while its thread is inside a store call."""
    root = tmp_path / "fifty"
    job_config(root, prepared, "train.max_steps=2", "train.valid_every=2", *SAME[:2], shared=True)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for attempt in range(50):
            program = (str(HELPERS / "busy_heartbeat.py"),) if attempt % 2 else ("-m", "mtx")
            code, err = finish(torchrun(root, "--overwrite", shared=True, program=program))
            assert code == 0, f"attempt {attempt}: {err[-3000:]}"
            assert last(root / "run").step == 2
    finally:
        hog.kill()
