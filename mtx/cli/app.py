"""The Typer app every `mtx` command is registered on, and what the commands share: the one
way an error in the user's input ends a command, the config and checkpoint options, and
option help taken from the config key an option sets.

Errors in the user's input end the command with one line on stderr and exit code 2; `mtx
--debug COMMAND` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Annotated

import typer

from mtx.config import describe
from mtx.errors import MtxError
from mtx.files import restrict_umask

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train Transformer translation models end to end.",
)
_debug = False

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a config key: key=value (repeatable; every key: docs/config.md).",
    ),
]
CkptOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--checkpoint",
        help="A checkpoint (embeds its config and vocabulary). Repeat it to decode with the "
        "ensemble of several: the mean of their probabilities at each step.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def fail(message: str) -> None:
    typer.echo(f"mtx: error: {message}", err=True)
    _tell_torchrun(f"mtx: error: {message}")
    raise typer.Exit(2)


def _tell_torchrun(line: str) -> None:
    """Under torchrun, `line` in the error file it reads (TORCHELASTIC_ERROR_FILE): its summary
    of the failed job then names it as the root cause, not a link to its documentation
    (docs/distributed.md, "A refusal under torchrun")."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    stamp = str(int(time.time()))
    record = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": stamp}}}
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(record))


def run(fn, *args, **kwargs):
    """Call fn, turning MtxError into a one-line message and exit code 2 (130 on Ctrl-C)."""
    try:
        return fn(*args, **kwargs)
    except MtxError as e:
        if _debug:
            raise
        fail(str(e))
    except OSError as e:  # permissions, a full disk, a file where a directory should be
        if _debug:
            raise
        fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
    except KeyboardInterrupt:
        if _debug:
            raise
        typer.echo("mtx: interrupted", err=True)
        raise typer.Exit(130) from None


def log(msg: str) -> None:
    typer.echo(msg, err=True)


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    global _debug
    _debug = debug
    restrict_umask()


def load(config: Path | None, overrides: list[str] | None):
    """The config of --config with --set applied, validated; one line if it cannot be."""
    from mtx.config import load_config

    if config is None:
        fail("--config is required")
    return run(load_config, config, overrides)


def checkpoint_paths(
    checkpoints: list[Path] | None, config: Path | None, overrides: list[str] | None
) -> list[Path]:
    """The checkpoints given, or RUN/checkpoints/best.pt of the config's run."""
    if checkpoints:
        return checkpoints
    if config is None:
        fail("give --checkpoint, or --config to use RUN/checkpoints/best.pt")
    from mtx.checkpoint import RunDir

    return [RunDir.of(load(config, overrides)).best]


def setting_help(key: str, default: str = "the checkpoint's") -> str:
    """An option's help from the config key it sets (its declaration in mtx/config/)."""
    text = describe(key).replace("[", "\\[")  # not a rich markup tag
    return f"{text[0].upper()}{text[1:]}; default: {default} {key}."
