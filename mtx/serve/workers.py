"""Decoding processes for `mtx serve` (`serve.workers`).

On the CPU, a search over the few sentences that a server's clients have in flight spends most
of each step on small operations, one after another, with the Python interpreter between
them: one process keeps about one core busy whatever its thread count. N processes, each with
cores / N threads and its own copy of the engine, decode N batches at once; the batcher
(batcher.py) spreads the queued sentences over them. BENCHMARKS.md, "Serving", has the figures.

Every engine lives in a decoding process, even when there is one (on a GPU, or with
`serve.workers=1`): the server's own process only answers HTTP and never imports torch
(front.py). Each `Worker` is a child process, spawned (not forked: the server already runs
threads), that builds its engine with `make_engine` from the checkpoints, --set overrides and
device given, so its answers are the ones `mtx translate` gives: the search does not depend on
the thread count (tests/test_translator.py). The first one started also describes its engine
to the server (`About`), which then decides how many more to start and how many threads each
gets (sent to the first one as `threads` once known). A worker decodes one batch at a time,
sent over a pipe. It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the
server stops its workers once it has drained) and ends when the server says so or its pipe
closes, so it never outlives the server. A worker that dies is started again, and the batch it
held is sent once more to the new one.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path

from mtx.decode.controls import Line
from mtx.decode.options import Options
from mtx.errors import MtxError
from mtx.serve.front import About, Result

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Spec:
    """How a worker builds its engine: `make_engine`'s arguments, and its torch threads (0:
    torch's default, until told)."""

    engine: str
    checkpoints: list[Path]
    overrides: list[str] = field(default_factory=list)
    device: str = "cpu"
    ct2_dir: Path | None = None
    threads: int = 0


class WorkerDied(RuntimeError):
    """A decoding process ended while decoding a batch, twice."""


def _main(conn, spec: Spec, describe: bool) -> None:
    """The worker process: build the engine (and describe it if `describe`), then decode
    batches until told to stop. Messages: ("batch", texts, options), ("threads", n), None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch

    from mtx.serve.engine import describe_engine, make_engine

    try:
        if spec.threads:
            torch.set_num_threads(spec.threads)
        engine = make_engine(
            spec.engine, spec.checkpoints, spec.overrides, spec.device, spec.ct2_dir
        )
        about = describe_engine(engine, spec.checkpoints, spec.overrides) if describe else None
    except Exception as e:  # the server reports it and exits
        conn.send(("failed", str(e) if isinstance(e, MtxError) else f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", (os.getpid(), about)))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the server is gone
            return
        if message is None:
            return
        if message[0] == "threads":
            engine.set_threads(message[1])
            continue
        _, texts, options = message
        try:
            reply = ("ok", engine.translate(texts, options))
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        conn.send(reply)


class Worker:
    """One decoding process; `translate` is the batcher's engine for one of its workers."""

    def __init__(self, spec: Spec, index: int) -> None:
        self.spec, self.index = spec, index
        self.process = self.conn = None
        self.pid: int | None = None
        self.about: About | None = None  # the first worker's description of its engine

    def launch(self) -> None:
        """Start the process; `wait_ready` waits for its engine."""
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_main,
            args=(child, self.spec, self.index == 0 and self.about is None),
            name=f"mtx-serve-decoder-{self.index}",
        )
        self.process.daemon = True  # ended with the server, whatever happens to it
        self.process.start()
        child.close()

    def wait_ready(self) -> None:
        """Wait until the engine is built; MtxError if it could not be."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise MtxError(f"decoding process {self.index} did not start in {START_TIMEOUT_S:g} s")
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(STOP_TIMEOUT_S)
            code = self.process.exitcode
            raise MtxError(
                f"decoding process {self.index} ended while starting (exit {code})"
            ) from None
        if kind != "ready":
            raise MtxError(value)
        self.pid, about = value
        self.about = self.about or about

    def set_threads(self, n: int) -> None:
        """Decode with `n` threads from now on, and after a restart."""
        self.spec = replace(self.spec, threads=n)
        self.conn.send(("threads", n))

    def translate(self, texts: list[str | Line], options: Options) -> list[Result]:
        for attempt in range(2):
            try:
                self.conn.send(("batch", texts, options))
                kind, value = self.conn.recv()
            except (EOFError, OSError):  # the process died: start another and retry once
                self.process.join(1)
                code = self.process.exitcode
                self.kill()
                if attempt:
                    raise WorkerDied(
                        f"decoding process {self.index} died twice (exit {code})"
                    ) from None
                self.launch()
                self.wait_ready()
                continue
            if kind == "error":
                raise RuntimeError(value)
            return value
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Ask the process to end, and wait for it (killed if it does not)."""
        if self.process is None:
            return
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(STOP_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join()
        if self.conn is not None:
            self.conn.close()


def start_workers(spec: Spec, n: int, first: int = 0) -> list[Worker]:
    """`n` decoding processes numbered from `first`, started together and each ready (the one
    numbered 0 with its `about`); MtxError if one fails."""
    workers = [Worker(spec, first + i) for i in range(n)]
    try:
        for worker in workers:
            worker.launch()
        for worker in workers:
            worker.wait_ready()
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers
