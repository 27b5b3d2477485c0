"""A made-up control, declared in one place (`declare`): `tone`, a text, which no search takes
unless told to. Run as a script, it declares it and runs the CLI: `python madeup.py serve ...`
is `mtx serve` with the control declared, in the server's process and (spawned, they import
this script again) in its decoding processes."""

from __future__ import annotations

import dataclasses
import os
import sys

from mtx.decode import dispatch
from mtx.decode.controls import CONTROLS, Control

TONE = Control("tone", "text", "a made-up control")


def declare(taken: bool = False) -> None:
    """Declare `tone`; `taken`: the constrained beam search takes it (and reads nothing of it)."""
    CONTROLS[TONE.name] = TONE
    if taken:
        takes = dispatch.CONSTRAINED.takes | {TONE.name}
        dispatch.CONSTRAINED = dataclasses.replace(dispatch.CONSTRAINED, takes=takes)


if __name__ in ("__main__", "__mp_main__"):
    declare(taken=os.environ.get("MADEUP_TAKEN") == "1")
    if __name__ == "__main__":
        from mtx.cli import app

        sys.exit(app())
