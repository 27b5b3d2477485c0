"""A made-up control and a made-up engine, each declared in one place (`declare`):

- `tone`, a text control, which no engine of mtx takes;
- `echo`, an engine that takes `tone` and nothing else and gives no alignments: each output is
  its source's pieces (EOS excluded), then the tone's; `decode.engine: auto` chooses it for a
  sentence with a tone, and `decode.engine=echo` for every sentence.

Run as a script, it declares them and runs the CLI: `python madeup.py serve ...` is `mtx serve`
with them declared, in the server's process and (spawned, they import this script again) in
its decoding processes. MADEUP=control declares the control alone."""

from __future__ import annotations

import os
import sys

from mtx.decode import engines
from mtx.decode.controls import CONTROLS, Control

TONE = Control("tone", "text", "a made-up control")


def _echo(rt, batch, options) -> list:
    """Each request's source pieces (EOS excluded), then its tone's target ids."""
    from mtx.decode.rules import Hypothesis

    out = []
    for r in batch.requests:
        tokens = [*r.source[:-1], *r.controls.tone]
        out.append([Hypothesis(tokens, 0.0, 0.0)] * options.nbest)
    return out


ECHO = engines.Engine(
    "echo", "the echo engine", _echo, takes=frozenset({TONE.name}), gives=frozenset(),
    auto=lambda ask: TONE.name in ask.controls,
)  # fmt: skip


def declare(engine: bool = True) -> None:
    """Declare `tone`, and `echo` (before the engines of other controls) if `engine`."""
    CONTROLS[TONE.name] = TONE
    if engine:
        engines.register(ECHO, before="alternatives")


if __name__ in ("__main__", "__mp_main__"):
    declare(engine=os.environ.get("MADEUP") != "control")
    if __name__ == "__main__":
        from mtx.cli import app

        sys.exit(app())
