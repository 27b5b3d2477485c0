"""The README's and the manual's commands work as written: every `mtx` command line in their
code blocks names a command and options that exist and parses (a renamed option or command
fails here, not in a user's terminal), and, behind `slow`, the README's quick start runs as
written in a fresh directory and prints what the README shows."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtx.cli import app

ROOT = Path(__file__).resolve().parents[1]


def code_blocks(text: str) -> list[str]:
    """The lines of a Markdown text's fenced code blocks, a line ending with a backslash
    joined to the next."""
    lines = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    return lines


def mtx_commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, arguments after `mtx`) of each `mtx ...` or `$ mtx ...` line in the
    file's code blocks; a trailing comment and the shell's redirections left out."""
    text = path.read_text()
    found = []
    for line in code_blocks(text):
        command = line.removeprefix("$ ").strip()
        if not command.startswith("mtx "):
            continue
        words = shlex.split(command, comments=True)
        kept = []
        for word in words[1:]:
            if word in ("<", ">", "|") or word.startswith(("<", ">")):
                break  # the rest is the shell's
            kept.append(word)
        start = text.find(line.split("  ")[0])
        number = text[:start].count("\n") + 1
        found.append((number, kept))
    return found


def refusal(args: list[str]) -> str | None:
    """Why `mtx ARGS` does not parse (a command or option that does not exist, an option
    without its value), or None: the line is run with --help appended, which stops the CLI
    once the command and its options are read, before it does anything."""
    result = RUNNER.invoke(app, [*args, "--help"])
    if result.exit_code == 0:
        return None
    lines = [line.strip("│╭╮╰╯─ ") for line in result.output.splitlines()]
    return " ".join(line for line in lines if line and line != "Error") or "exit code != 0"


RUNNER = CliRunner()


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_mtx_command_in_the_readme_and_the_manual_parses():
    commands = [(path, n, args) for path in DOCUMENTS for n, args in mtx_commands(path)]
    assert len(commands) > 50  # the quick start, docs/commands.md's table and the pages'
    refused = []
    for path, n, args in commands:
        why = refusal(args)
        if why is not None:
            refused.append(f"{path.relative_to(ROOT)}:{n}: mtx {shlex.join(args)}: {why}")
    assert not refused, "\n".join(refused)


def test_the_check_refuses_a_command_or_option_that_does_not_exist(tmp_path):
    assert refusal(["translate", "--checkpoint", "x.pt", "--beam", "4"]) is None
    assert refusal(["bench", "decode", "--checkpoint", "x.pt"]) is None
    for wrong in (["translat"], ["translate", "--beem", "4"], ["bench", "decoder"]):
        assert refusal(wrong) is not None, wrong
    assert not (tmp_path / "x.pt").exists()


def quick_start() -> list[tuple[str, list[str]]]:
    """The README's quick start: each `$ ` command with the lines it is shown printing."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```")[1]
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines()[1:]:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip() and steps:
            steps[-1][1].append(line)
    return steps


def test_the_quick_start_begins_in_the_environment_make_installs():
    """`make` installs into $(VENV) (.venv): the quick start activates it before its first
    `mtx`, so that it runs as typed after `make demo`."""
    steps = quick_start()
    venv = re.search(r"^VENV \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert steps[0] == (f". {venv}/bin/activate", [])


@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path):
    """In a directory holding only the repository's configs, each quick-start command as the
    README gives it exits 0 and prints the first line the README shows for it (its numbers
    are those of the CPU that made the README); the environment it activates is this
    Python's (.venv's, under `make test`), so `mtx` is the command `make` installed."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    activate, *steps = quick_start()
    assert [s.split()[1] for s, _ in steps] == ["prepare", "train", "toy", "translate", "evaluate"]
    env = Path(sys.prefix) / "bin" / "activate"
    for command, shown in steps:
        line = f". {shlex.quote(str(env))} && {command}"
        done = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, env=clean_env()
        )
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        printed = [p.strip() for p in (done.stdout + done.stderr).splitlines()]
        if shown:  # its first line as shown, any numbers (they are this CPU's)
            pattern = re.sub(r"\d[\d.,]*", r"[\\d.,]+", re.escape(shown[0]))
            assert any(re.fullmatch(pattern, p) for p in printed), (command, shown[0], printed)
    assert (tmp_path / "runs" / "toy" / "hyp.de").stat().st_size > 0


def clean_env() -> dict:
    """This environment without a virtual environment's PATH entry: the quick start's own
    activation must make `mtx` found."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    here = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != here)
    return env


def test_the_multi30k_recipe_without_the_network_stops_in_one_line_saying_what_to_fetch(
    tmp_path,
):
    """`bash scripts/multi30k.sh` in a checkout without data/ and without the network (every
    download sent to a closed port through https_proxy): it stops at the fetch, in one line
    naming the address and what to do instead, and leaves no data folder or run behind."""
    for folder in ("scripts", "configs"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    env = {**os.environ, "MTX": f"{shlex.quote(sys.executable)} -m mtx"}
    env |= {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    done = subprocess.run(
        ["bash", "scripts/multi30k.sh"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    message = done.stderr.strip()
    assert "\n" not in message, message
    assert "cannot download https://raw.githubusercontent.com/multi30k/dataset/" in message
    assert "gunzip them and put them in data/multi30k" in message
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()


def test_make_test_runs_the_fast_suite_and_names_its_15_slowest_tests():
    """CI runs `make test` (.ci/run): the suite without the slow tests, closing with the 15
    slowest, so that a run on a slower host shows where its time went."""
    target = re.search(r"^test: .*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert '-m "not slow"' in target and "--durations=15" in target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
