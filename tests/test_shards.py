"""Corpus jobs spread over torchrun's processes (mtx/jobs/shards.py): translation, scoring and
distillation on 2 CPU processes (gloo), each in its own directory with its own copy of the
inputs (as machines with their own disks) or all in one (a shared disk), write byte for byte
what one process writes; a worker killed with kill -9 and torchrun's restart too, and the parts
a killed job leaves are continued by one process. The machinery itself (offsets, blocks, which
process reads which block) is checked in this process with a job that needs no model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtx.data import toy
from mtx.data.sources import read_lines
from mtx.errors import MtxError
from mtx.jobs import shards
from mtx.jobs.corpus import CorpusJob, Record
from mtx.jobs.shards import Block, Part, chunked, cover, offsets, parts_dir, scan
from mtx.jobs.translate import run_job

HELPERS = Path(__file__).parent / "helpers"
LINES = 600


def sources(n: int = LINES) -> str:
    return "".join(src + "\n" for src, _ in toy.split_pairs("train")[:n])


def targets(n: int = LINES) -> str:
    return "".join(tgt + "\n" for _, tgt in toy.split_pairs("train")[:n])


def machines(root: Path, files: dict[str, str], shared: bool) -> list[Path]:
    """The directories the processes run in, each with `files` (one for a shared disk)."""
    nodes = [root] if shared else [root / "node0", root / "node1"]
    for node in nodes:
        node.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (node / name).write_text(text)
    return nodes


def torchrun(root: Path, *args: str, shared=False, restarts=0, program=("-m", "mtx"), env=None):
    """`mtx ARGS` on 2 torchrun processes (1 thread each), each in root/node$LOCAL_RANK unless
    `shared`; returns (exit code, stderr)."""
    where = "." if shared else "node$LOCAL_RANK"
    script = f'cd "{root}/{where}" && exec "$PYTHON" "$@"'
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [f"--max-restarts={restarts}", "--monitor-interval=0.1", "--no-python"]
    cmd += ["sh", "-c", script, "sh", *program, *args]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHON": sys.executable} | (env or {})
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    return done.returncode, done.stderr


def alone(where: Path, *args: str) -> subprocess.CompletedProcess:
    """`mtx ARGS` in one process (1 thread), in `where`."""
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mtx", *args], cwd=where, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def model(run: Path) -> list[str]:
    return ["--checkpoint", str(run / "checkpoints" / "best.pt"), "--device", "cpu"]


# -- the machinery, in this process ---------------------------------------------------------


def test_offsets_find_where_each_line_begins_across_reads_and_line_endings(tmp_path):
    path = tmp_path / "lines.txt"
    lines = [("x" * (i % 97)) + ("\r\n" if i % 5 == 0 else "\n") for i in range(40_000)]
    data = "".join(lines).encode() + b"last line, unterminated"
    path.write_bytes(data)  # over 1 MiB: lines cross the reads of 1 MiB
    assert len(data) > 1 << 20
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode()))
    wanted = [0, 1, 2, 511, 512, 9_999, 20_000, 33_333, 39_999, 40_000]
    assert offsets(path, wanted) == {n: starts[n] for n in wanted}
    from mtx.data.sources import lines_at

    assert lines_at(path, starts[20_000], 3, 20_000) == [
        x.rstrip("\r\n") for x in lines[20_000:20_003]
    ]
    assert lines_at(path, starts[40_000], 1, 40_000) == ["last line, unterminated"]


def test_cover_takes_each_line_once_preferring_rank_0_and_names_the_gaps():
    a = Block(0, 10, "t-0", 0, 100)
    b = Block(10, 10, "t-1", 0, 100)
    overlapping = Block(5, 10, "u-1", 0, 100)  # an earlier attempt's chunk
    c = Block(30, 5, "t-1", 100, 50)
    # a shared disk: both processes see t-1; rank 0 reads it
    chosen, gaps = cover([[a, b, c], [b, overlapping, c]], 40)
    assert chosen == [(0, a), (0, b), (0, c)] and gaps == [(20, 30), (35, 40)]
    # own disks: what only process 1 holds, process 1 sends
    chosen, gaps = cover([[a], [b, overlapping, c]], 35)
    assert chosen == [(0, a), (1, b), (1, c)] and gaps == [(20, 30)]
    assert cover([[], []], 7) == ([], [(0, 7)])


def test_chunks_fill_the_gaps_longest_first(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("".join("w " * (i % 13) + "\n" for i in range(100)))
    plan = chunked(path, [(0, 10), (37, 100)], 8)
    assert sorted(plan) == [
        (s, min(8, e - s)) for a, e in [(0, 10), (37, 100)] for s in range(a, e, 8)
    ]
    lines = path.read_text().splitlines(keepends=True)
    size = [sum(len(x) for x in lines[f : f + n]) for f, n in plan]
    assert size == sorted(size, reverse=True)


def test_a_part_keeps_whole_blocks_and_a_part_of_another_job_is_refused(tmp_path):
    directory = tmp_path / "out.parts"
    part = Part(directory, "abc-1", "job1")
    part.add(0, ["a\n", "b\n"])
    part.add(7, ["c\n"])
    part._write(part.text, b"half of a blo")  # a kill mid-block: no index line names it
    part.close()
    with open(directory / "abc-1.idx", "ab") as f:
        f.write(b"9 1 5")  # an index line cut short
    assert scan(directory, "job1") == [Block(0, 2, "abc-1", 0, 4), Block(7, 1, "abc-1", 4, 2)]
    with pytest.raises(MtxError, match=r"abc-1.txt is part of another job .*remove .*out.parts"):
        scan(directory, "job2")


def upper_job(src: Path, calls: list) -> CorpusJob:
    """A job with no model: each line's output is its number and the line in capitals."""

    def render(first, rows):
        calls.append((first, len(rows)))
        return [f"{first + i} {row[0].upper()}\n" for i, row in enumerate(rows)]

    record = Record(str(src), src.stat().st_size, [], {}, {}, reads={"job": "upper"})
    return CorpusJob([src], record, 1, render)


def upper_corpus(tmp_path, lines: int):
    """`upper_job` over `lines` toy sources: the job, the output it must write, the output's
    path, and the list its chunks are recorded in."""
    src = tmp_path / "in.en"
    src.write_text(sources(lines))
    expected = "".join(f"{i} {line.upper()}\n" for i, line in enumerate(read_lines(src)))
    calls: list = []
    return upper_job(src, calls), expected, tmp_path / "out.up", calls


def test_one_process_continues_the_parts_a_killed_job_left_and_merges_them(tmp_path):
    job, expected, out, calls = upper_corpus(tmp_path, 100)
    run_job(job, out, chunk_lines=10)  # one process, no parts: written as it goes
    assert out.read_text() == expected and not parts_dir(out).exists()
    # what a killed 2-process job leaves: its record, parts of two attempts (one torn)
    out.unlink()
    first = Part(parts_dir(out), "t0-0", shards.begin(out, job, True, 100)[2])
    first.add(20, expected.splitlines(keepends=True)[20:30])
    second = Part(parts_dir(out), "t1-1", shards.begin(out, job, True, 100)[2])
    second.add(50, expected.splitlines(keepends=True)[50:60])
    second._write(second.text, b"60 TORN")
    first.close(), second.close()
    calls.clear()
    with pytest.raises(MtxError, match="out.up.parts exists: --resume continues it"):
        run_job(job, out, chunk_lines=10)
    done = run_job(job, out, resume=True, chunk_lines=10)
    assert out.read_text() == expected and not parts_dir(out).exists()
    assert (done.lines, done.before) == (80, 20)
    assert sorted(calls) == [(s, 10) for s in (0, 10, 30, 40, 60, 70, 80, 90)]  # none twice
    calls.clear()
    assert run_job(job, out, resume=True).lines == 0 and not calls  # finished: nothing more


def test_a_torchrun_job_continues_what_one_process_began(tmp_path):
    """An output one process began (its complete lines) is a block rank 0 holds."""
    job, expected, out, calls = upper_corpus(tmp_path, 50)
    run_job(job, out, chunk_lines=7)
    out.write_text(expected[: expected.index("23 ")] + "23 CUT SH")  # killed mid-line 24
    parts_dir(out).mkdir()  # as if torchrun's processes had begun
    calls.clear()
    assert run_job(job, out, resume=True, chunk_lines=7).before == 23
    assert out.read_text() == expected and min(calls)[0] == 23


# -- on 2 processes under torchrun ----------------------------------------------------------


# the default run's one two-process job (make test); the others run in make test-all
@pytest.mark.parametrize(
    "shared", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["own-disks", "shared-disk"]
)
def test_two_processes_translate_a_corpus_byte_for_byte_as_one(toy_run, tmp_path, shared):
    """n-best lists (the line numbers are the whole input's), --chunk-lines small enough that
    each process takes many chunks."""
    args = ["translate", *model(toy_run), "--input", "in.en", "--chunk-lines", "16"]
    args += ["--nbest", "2", "--beam", "2"]
    [one] = machines(tmp_path / "one", {"in.en": sources()}, shared=True)
    done = alone(one, *args, "--output", "out.de")
    assert done.returncode == 0, done.stderr
    nodes = machines(tmp_path / "two", {"in.en": sources()}, shared)
    code, err = torchrun(tmp_path / "two", *args, "--output", "out.de", shared=shared)
    assert code == 0, err[-3000:]
    assert f"translated {LINES:,} lines into out.de (2 processes, merged " in err
    assert (nodes[0] / "out.de").read_bytes() == (one / "out.de").read_bytes()
    assert sorted(p.name for p in nodes[-1].iterdir()) == sorted(
        ["in.en"] + (["out.de", "out.de.progress.json"] if shared else [])
    )  # the parts are gone; only rank 0 wrote the output


@pytest.mark.slow  # a two-process job
def test_two_processes_translate_json_lines_with_controls_as_one(toy_run, tmp_path):
    lines = [json.loads(json.dumps({"text": s})) for s in sources(200).splitlines()]
    for i, line in enumerate(lines):
        if i % 3 == 0:
            line["prefix"] = "oft"
        if i % 4 == 1:
            line["constraints"] = ["blume"]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    args = ["translate", *model(toy_run), "--input", "in.jsonl", "--json", "--chunk-lines", "8"]
    [one] = machines(tmp_path / "one", {"in.jsonl": text}, shared=True)
    done = alone(one, *args, "--output", "out.jsonl")
    assert done.returncode == 0, done.stderr
    nodes = machines(tmp_path / "two", {"in.jsonl": text}, shared=False)
    code, err = torchrun(tmp_path / "two", *args, "--output", "out.jsonl")
    assert code == 0, err[-3000:]
    assert (nodes[0] / "out.jsonl").read_bytes() == (one / "out.jsonl").read_bytes()
    summary = [x for x in done.stderr.splitlines() if x.startswith("constraints:")]
    assert summary and summary[0] in err  # the count covers both processes' lines


@pytest.mark.slow  # two-process jobs
def test_two_processes_score_and_distill_as_one(toy_run, tmp_path):
    files = {"in.en": sources(300), "in.de": targets(300)}
    score = ["score", *model(toy_run), "--src", "in.en", "--tgt", "in.de", "--chunk-lines", "16"]
    score += ["--per-token"]
    distill = ["distill", *model(toy_run), "--src", "in.en", "--ref", "in.de", "--nbest", "2"]
    distill += ["--beam", "2", "--chunk-lines", "16", "--output-dir", "distilled"]
    [one] = machines(tmp_path / "one", files, shared=True)
    nodes = machines(tmp_path / "two", files, shared=False)
    said = []
    for args in (score + ["--output", "scores.txt"], distill):
        done = alone(one, *args)
        assert done.returncode == 0, done.stderr
        code, err = torchrun(tmp_path / "two", *args)
        assert code == 0, err[-3000:]
        said.append(err)
    assert "scored 300 pairs into scores.txt (2 processes, merged " in said[0]
    assert "translated 300 lines into distilled/teacher.de.jsonl (2 processes, merged " in said[1]
    plain = alone(one, *score)  # to stdout, as before
    assert (nodes[0] / "scores.txt").read_text() == (one / "scores.txt").read_text() == plain.stdout
    for name in ("distilled.en", "distilled.de", "teacher.de.nbest", "closest.de"):
        assert (nodes[0] / "distilled" / name).read_bytes() == (
            one / "distilled" / name
        ).read_bytes()
    report = json.loads((nodes[0] / "distilled" / "distill.json").read_text())
    assert report["pairs"] == 300 and report["kept"] == 285
    assert not (nodes[1] / "distilled" / "distill.json").exists()  # rank 0 wrote the corpus


@pytest.mark.slow  # two-process jobs, one killed and restarted
@pytest.mark.parametrize("shared", [False, True], ids=["own-disks", "shared-disk"])
def test_a_worker_killed_mid_job_and_restarted_by_torchrun_writes_the_same_file(
    toy_run, tmp_path, shared
):
    """torchrun --max-restarts=1 ... --resume: rank 1 writes a chunk and half of another, then
    SIGKILLs itself (tests/helpers/die_in_corpus_job.py); torchrun restarts both workers, which
    compute only the lines no whole block holds (rank 1's chunk is sent from its own disk)."""
    args = ["translate", *model(toy_run), "--input", "in.en", "--chunk-lines", "16"]
    args += ["--output", "out.de", "--resume"]
    [one] = machines(tmp_path / "one", {"in.en": sources()}, shared=True)
    done = alone(one, *args)
    assert done.returncode == 0, done.stderr
    nodes = machines(tmp_path / "two", {"in.en": sources()}, shared)
    program = (str(HELPERS / "die_in_corpus_job.py"),)
    code, err = torchrun(tmp_path / "two", *args, shared=shared, restarts=1, program=program)
    assert code == 0, err[-3000:]
    assert "exitcode: -9" in err or "SIGKILL" in err, err[-3000:]  # torchrun saw it die
    assert " done before, merged " in err  # the restart kept what the killed attempt had done
    assert (nodes[0] / "out.de").read_bytes() == (one / "out.de").read_bytes()
    assert not any(parts_dir(node / "out.de").exists() for node in nodes)


@pytest.mark.slow  # two-process jobs
def test_different_inputs_or_no_output_are_one_line_on_every_process(toy_run, tmp_path):
    nodes = machines(tmp_path, {"in.en": sources(50)}, shared=False)
    (nodes[1] / "in.en").write_text(sources(51))
    args = ["translate", *model(toy_run), "--input", "in.en", "--output", "out.de"]
    code, err = torchrun(tmp_path, *args)
    assert code != 0
    said = [x for x in err.splitlines() if x.startswith("mtx: error:")]
    assert len(said) == 2 and all("process 1's in.en differs from process 0's" in x for x in said)
    # torchrun's summary names mtx's line as the root cause (docs/distributed.md)
    assert "traceback : mtx: error: process 1's in.en differs from process 0's" in err
    assert not (nodes[0] / "out.de").exists()
    code, err = torchrun(tmp_path, "score", *model(toy_run), "--src", "in.en", "--tgt", "in.en")
    said = [x for x in err.splitlines() if x.startswith("mtx: error:")]
    assert code != 0 and len(said) == 2, err[-3000:]
    assert all("mtx score under torchrun spreads a corpus over its processes: give --src, "
               "--tgt and --output" in x for x in said)  # fmt: skip


def test_what_a_job_counted_is_summed_over_the_processes_by_its_merge():
    """A corpus job's counts (a translator's Stats: the glossary's counts, what the drafts were
    worth) on rank 0 become the sums of every process's, the drafts' batches by length."""
    from mtx.decode.glossary import Report
    from mtx.decode.speculative import DraftStats
    from mtx.decode.translator import Stats

    class TwoProcesses:  # what Dist.gather gives: each process's object, in rank order
        main = True

        def gather(self, obj):
            other = Stats(Report(lines=2, constraints=3), DraftStats(4, 8, 6, {0: 1, 2: 5}))
            return [obj, other]

    mine = Stats(Report(lines=1, constraints=1, terms=7), DraftStats(1, 2, 1, {0: 3, 1: 1}))
    job = CorpusJob([], Record("in", 0, [], {}, {}), 1, lambda *a: [], counted=mine)
    shards.add_counts(TwoProcesses(), job)
    glossary, drafts = mine.terms, mine.drafts
    assert (glossary.lines, glossary.constraints, glossary.terms) == (3, 4, 7)
    assert (drafts.checks, drafts.drafted, drafts.accepted) == (5, 10, 7)
    assert drafts.batches == {0: 4, 1: 1, 2: 5}
