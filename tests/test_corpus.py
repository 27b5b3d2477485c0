"""mtx translate --input --output [--resume] (jobs/corpus.py, jobs/translate.py): a whole corpus into a file
that lines up with it; a run killed with kill -9 and resumed writes the same file."""

import json
import random
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from helpers.common import invoke

from mtx.cli.lines import Output
from mtx.data import toy
from mtx.data.sources import count_lines
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.jobs.corpus import Record, complete
from mtx.jobs.translate import translate_corpus

LINES = 300


def source(tmp_path):
    path = tmp_path / "in.en"
    path.write_text("".join(src + "\n" for src, _ in toy.split_pairs("train")[:LINES]))
    return path


def command(run, src, out, *extra: str) -> list[str]:
    ckpt = str(run / "checkpoints" / "best.pt")
    return [sys.executable, "-m", "mtx", "translate", "--checkpoint", ckpt, "--device", "cpu",
            "--input", str(src), "--output", str(out), "--chunk-lines", "8", *extra]  # fmt: skip


def translate(run, src, out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(run, src, out, *extra), capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def wait_for_lines(proc, path, n: int) -> bool:
    """True once `path` holds n lines while `proc` runs; False if it ended first."""
    while proc.poll() is None:
        if path.exists() and count_lines(path) >= n:
            return True
        time.sleep(0.005)
    return False


# slow: three kill -9 and four processes translating 300 lines (a multi-process loop); the
# in-process test below checks the same cut-and-continue rule on every CI run
@pytest.mark.slow
def test_a_corpus_translation_killed_and_resumed_writes_the_uninterrupted_file(toy_run, tmp_path):
    src = source(tmp_path)
    done = translate(toy_run, src, tmp_path / "ref.de")
    assert done.returncode == 0, done.stderr
    reference = (tmp_path / "ref.de").read_bytes()
    assert reference.count(b"\n") == LINES and "translated 300 lines" in done.stderr
    # stderr is a pipe, not a terminal: plain progress lines, the last at the end
    assert f"translated {LINES:,}/{LINES:,} lines (100%)" in done.stderr and "\r" not in done.stderr
    out, rng, target, kills = tmp_path / "out.de", random.Random(3), 0, 0
    while True:
        proc = subprocess.Popen(command(toy_run, src, out, *(["--resume"] if kills else [])),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        if kills < 3:
            target += rng.randint(15, 70)
            if wait_for_lines(proc, out, target):
                time.sleep(rng.uniform(0.0, 0.02))  # sometimes in the middle of a chunk
                proc.kill()
                proc.wait()
                kills += 1
                continue
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        break
    assert kills == 3
    assert out.read_bytes() == reference
    again = translate(toy_run, src, out, "--resume")  # finished: nothing more to translate
    assert again.returncode == 0 and "translated 0 lines" in again.stderr
    assert out.read_bytes() == reference


def test_resume_cuts_what_a_kill_left_of_an_n_best_block(toy_run, tmp_path):
    """A kill can leave a line cut short or part of an input line's n-best block: resuming
    keeps the complete blocks only and goes on from the next input line."""
    tr = Translator.from_checkpoints(toy_run / "checkpoints" / "best.pt", ["decode.beam=3"], "cpu")
    src = tmp_path / "few.en"
    src.write_text("".join(s + "\n" for s, _ in toy.split_pairs("test")[:30]))
    options = tr.options(nbest=2)
    record = Record.of(src, tr.parts, options, [])
    assert record.options["nbest"] == 2 and record.options["beam"] == 3
    assert "draft" not in record.options and "batch_tokens" not in record.settings  # neutral

    fmt = Output(tr, options, json_lines=False)  # 'LINE ||| TEXT ||| SCORE ||| LOG-PROBABILITY'

    ref = tmp_path / "ref.de"
    assert translate_corpus(fmt, src, ref, record, chunk_lines=4) == 30
    lines = ref.read_bytes().splitlines(keepends=True)
    assert len(lines) == 60 and lines[21].startswith(b"10 ||| ")
    out = tmp_path / "out.de"
    out.write_bytes(b"".join(lines[:21]) + lines[21][:7])  # block 10 half written, cut short
    Record.path(out).write_text(json.dumps(asdict(record)))  # as the killed run left it
    assert complete(out, 2) == 10 and out.read_bytes() == b"".join(lines[:20])
    out.write_bytes(b"".join(lines[:21]) + lines[21][:7])
    assert translate_corpus(fmt, src, out, record, resume=True, chunk_lines=4) == 20
    assert out.read_bytes() == ref.read_bytes()
    bigger = Record.of(src, tr.parts, tr.options(nbest=3), [])  # another nbest
    out.write_bytes(b"")
    Record.path(out).write_text(json.dumps(asdict(record)))
    with pytest.raises(MtxError, match="--resume: options.nbest is 3 but .* was begun with 2"):
        translate_corpus(Output(tr, tr.options(nbest=3), False), src, out, bigger, resume=True)


def test_lines_are_counted_as_they_are_read(tmp_path):
    path = tmp_path / "x"
    for text, n in [("", 0), ("a\n", 1), ("a\nb", 2), ("a\n\nb\n", 3), ("\n", 1)]:
        path.write_text(text)
        assert count_lines(path) == n, text


def test_corpus_translation_refuses_what_it_cannot_continue(toy_run, tmp_path):
    src = source(tmp_path)
    (tmp_path / "few.en").write_text("".join(src.read_text().splitlines(True)[:20]))
    src, out = tmp_path / "few.en", tmp_path / "out.de"

    def translate(*extra):  # in this process: a refusal needs no process of its own
        return invoke(*command(toy_run, src, out, *extra)[3:])

    assert translate().exit_code == 0
    again = translate()  # an output that exists, without --resume
    assert again.exit_code == 2 and "exists: --resume continues it" in again.output
    Record.path(out).unlink()
    unknown = translate("--resume")  # no record of how it was begun
    assert unknown.exit_code == 2 and "nothing says how it was begun" in unknown.output
    Record.path(out).write_text('{"input": "x"}')
    other = translate("--resume", "--beam", "2")
    assert other.exit_code == 2 and "--resume: input is" in other.output
    args = command(toy_run, src, out)
    no_input = invoke(*args[3 : args.index("--input")], "--output", out)
    assert no_input.exit_code == 2 and "--output and --resume take --input" in no_input.output
    for err in (again.output, unknown.output, other.output, no_input.output):
        assert len(err.strip().splitlines()) == 1, err
