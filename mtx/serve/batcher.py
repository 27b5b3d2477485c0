"""Dynamic batching: sentences of concurrent requests decoded together, off the event loop.

A request's texts become one `Job` each in one queue. A worker takes the oldest job, waits at
most `max_wait_s` (from its arrival, or from the end of that worker's previous batch if later)
for more jobs with the same options (decode/options.py: beam, n-best, ...) until their source
tokens, padded as the translator pads them, fill `batch_tokens`, or until as many jobs as its
previous batch held are queued (the clients it answered have sent their next lines: a closed loop of clients
then waits no longer than they take), and hands that batch to its engine
(engine.py). A long request is spread over several batches; each job knows its request and its
place in it, and the request is answered, in order, when its last job is done. With `batching`
off, a worker takes the oldest request's jobs alone: one request at a time, as servers that
serialise requests behind a lock do (for comparison).

There is one worker per engine given (`mtx serve` gives one per decoding process:
workers.py). One worker at a time builds a batch: of the idle workers, the one idle longest
(they queue up in `idle`, first come first served). While others are idle, it takes its share
of the queued tokens (the queued tokens divided by the idle workers), so that the sentences of
concurrent clients are spread over the workers rather than all decoded by one while the
others wait; a worker that has just finished a batch goes behind those already waiting, so
every worker gets its turn, however fast its batches end.

The event loop only queues jobs and awaits the request's future; a worker resolves it with
`loop.call_soon_threadsafe`. The workers are `work()`, run by `mtx serve` in its main thread
(the first worker there, the others in threads of their own; the HTTP server runs in another
thread: app.py), or in a thread after `start()`. Health checks and new requests are answered
while batches decode.

Stopping (SIGTERM): `drain()` refuses new requests (ShuttingDown), stops waiting for batches
to fill, and lets the workers finish the queue; `stop()` fails what is still queued with
ShuttingDown and ends the workers. Python runs a signal's handler in the main thread, which in
`mtx serve` is a worker waiting here, but the kernel may deliver SIGTERM to any thread, and a
main thread blocked in a wait would run the handler only once woken (a stalled batch: after
`max_wait_s`, or a request's timeout). So no wait lasts longer than WAKE_S: the handler runs,
and the drain begins, within WAKE_S whichever thread took the signal (tests/test_batcher.py).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mtx.decode.controls import Line
from mtx.decode.options import Options
from mtx.serve.front import Result
from mtx.tokens import padded_length

WAKE_S = 0.25  # the longest a worker waits before looking again (see above)

__all__ = ["Batcher", "Job", "QueueFull", "Request", "ShuttingDown"]


class QueueFull(Exception):
    """The queue holds too many sentences to take this request."""


class ShuttingDown(Exception):
    """The service is stopping and takes no new work; or stopped before this work was done."""


class Request:
    """One HTTP request's texts: resolved on the event loop when every job is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.results: list[Result | None] = [None] * n
        self.left = n
        self.cancelled = False  # set by the event loop (timeout): the worker skips its jobs

    def _deliver(self, index: int, result: Result | BaseException) -> None:  # on the loop
        if self.future.done():
            return
        if isinstance(result, BaseException):
            self.future.set_exception(result)
            return
        self.results[index] = result
        self.left -= 1
        if self.left == 0:
            self.future.set_result(self.results)

    def deliver(self, index: int, result: Result | BaseException) -> None:  # from any thread
        self.loop.call_soon_threadsafe(self._deliver, index, result)


@dataclass
class Job:
    text: str | Line  # a text, or one with controls (decode/controls.py)
    tokens: int  # source tokens padded as the translator pads them: the budget's unit
    options: Options
    request: Request
    index: int  # its place in the request
    arrived: float = field(default_factory=time.monotonic)


Translate = Callable[[list[str | Line], Options], list[Result]]


class Batcher:
    def __init__(
        self,
        translate: Translate | Sequence[Translate],  # one engine per worker
        batch_tokens: int,
        max_wait_s: float,
        max_queue: int,
        batching: bool = True,
        on_batch: Callable[[list[Job]], None] = lambda jobs: None,
    ) -> None:
        self.engines = [translate] if callable(translate) else list(translate)
        self.batch_tokens = batch_tokens
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.batching = batching
        self.on_batch = on_batch  # metrics: called with each batch before it decodes
        self.queue: list[Job] = []
        self.cond = threading.Condition()
        self.draining = False
        self.stopped = False
        # time.monotonic() when each worker's last batch was answered
        self.last_done = [0.0] * len(self.engines)
        # sentences in each worker's last batch (none yet: wait the full max_wait_s)
        self.last_size = [math.inf] * len(self.engines)
        self.busy = 0  # workers decoding a batch now
        self.idle: list[int] = []  # workers waiting for their turn, the longest waiting first
        self.arrived: set[int] = set()  # workers that have come for work at least once
        self.forming = False  # a worker is building a batch (one at a time)
        self.working = False  # work() is running
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the workers in threads of their own (`mtx serve` runs `work()` in its main
        thread instead, and uvicorn in another)."""
        self.thread = threading.Thread(target=self.work, name="mtx-serve-worker", daemon=True)
        self.thread.start()

    @property
    def running(self) -> bool:
        """Every worker has come for work (each has been idle once) and none is stopping."""
        return self.working and len(self.arrived) == len(self.engines) and not self.draining

    def busy_workers(self) -> int:
        with self.cond:
            return self.busy

    def waiting_workers(self) -> list[int]:
        """The idle workers, in the order they will take batches."""
        with self.cond:
            return list(self.idle)

    def depth(self) -> int:
        with self.cond:
            return len(self.queue)

    def submit(
        self, request: Request, texts: list[str | Line], lengths: list[int], options: Options
    ):
        """Queue a request's texts (their source lengths in `lengths`), or raise QueueFull or
        ShuttingDown. Returns at once; the request's future gets the results."""
        padded = [padded_length(n) for n in lengths]
        with self.cond:
            if self.draining:
                raise ShuttingDown("the server is shutting down")
            if len(self.queue) + len(texts) > self.max_queue:
                raise QueueFull(
                    f"{len(self.queue)} sentences are queued and serve.max_queue is "
                    f"{self.max_queue}: try again shortly"
                )
            self.queue += [
                Job(text, n, options, request, i) for i, (text, n) in enumerate(zip(texts, padded))
            ]
            self.cond.notify_all()

    def cancel(self, request: Request) -> None:
        """Drop a request's queued jobs (it timed out); a batch already decoding finishes."""
        with self.cond:
            request.cancelled = True
            self.queue = [job for job in self.queue if job.request is not request]
            self.cond.notify_all()  # a worker waiting on one of its jobs looks again

    def drain(self) -> None:
        with self.cond:
            self.draining = True
            self.cond.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """Fail what is still queued with ShuttingDown, end the worker and wait for it (the
        batch decoding now finishes first)."""
        with self.cond:
            self.draining = self.stopped = True
            left, self.queue = self.queue, []
            self.cond.notify_all()
        for job in left:
            job.request.deliver(job.index, ShuttingDown("the server stopped before this was done"))
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _tokens(self, options: Options) -> int:
        return sum(job.tokens for job in self.queue if job.options == options)

    def _count(self, options: Options) -> int:
        return sum(job.options == options for job in self.queue)

    def _take(self, worker: int) -> list[Job] | None:
        """Worker `worker`'s next batch, waiting for it to fill; None once stopped."""
        with self.cond:
            self.idle.append(worker)
            self.arrived.add(worker)
            try:
                while not self.stopped and (
                    self.forming or not self.queue or self.idle[0] != worker
                ):
                    if self.draining and not self.queue:
                        return None
                    self.cond.wait(WAKE_S)
                if self.stopped:
                    return None
            finally:
                self.idle.remove(worker)
                self.cond.notify_all()  # the next in line may go once this one has formed
            self.forming = True
            try:
                return self._form(worker)
            finally:
                self.forming = False
                self.cond.notify_all()

    def _form(self, worker: int) -> list[Job]:
        """With the lock held: wait for the oldest job's batch to fill, then take it."""
        first = self.queue[0]
        if self.batching:
            # wait from the later of its arrival and this worker's last batch's end: the
            # clients that batch answered get max_wait_s to send their next request and join;
            # once as many sentences as that batch held are queued, they have (or others
            # took their place): waiting longer would only idle the worker
            deadline = max(first.arrived, self.last_done[worker]) + self.max_wait_s
            while not (self.draining or self.stopped):
                if not self.queue or self.queue[0] is not first:
                    break  # cancelled meanwhile
                if self._tokens(first.options) >= self.batch_tokens:
                    break
                if self._count(first.options) >= self.last_size[worker]:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, WAKE_S))
            if self.stopped or not self.queue or self.queue[0] is not first:
                return []  # stopped, or `first` was cancelled meanwhile: look again
        idle = len(self.engines) - self.busy
        share = math.ceil(self._tokens(first.options) / max(idle, 1))
        budget = min(self.batch_tokens, share)
        batch, rest, tokens = [], [], 0
        for job in self.queue:
            if self.batching:
                fits = job.options == first.options and (not batch or tokens + job.tokens <= budget)
            else:
                fits = job.request is first.request
            if fits:
                batch.append(job)
                tokens += job.tokens
            else:
                rest.append(job)
        self.queue = rest
        self.busy += bool(batch)  # at once, so that the next worker's share counts this one
        return batch

    def work(self) -> None:
        """Run the workers until drained or stopped: the first in this thread, the others in
        threads of their own, ended and joined before this returns."""
        self.working = True
        others = [
            threading.Thread(target=self._work, args=(i,), name=f"mtx-serve-worker-{i}")
            for i in range(1, len(self.engines))
        ]
        try:
            for thread in others:
                thread.start()
            self._work(0)
        finally:
            self.stop()  # the others end too (they finish the batch they decode)
            for thread in others:
                thread.join()
            self.working = False

    def _work(self, worker: int) -> None:
        translate = self.engines[worker]
        while True:
            taken = self._take(worker)
            if taken is None:
                return
            if not taken:
                continue
            batch, results = [job for job in taken if not job.request.cancelled], []
            try:  # counted busy since _take
                if batch:
                    self.on_batch(batch)
                    results = translate([job.text for job in batch], batch[0].options)
            except Exception as e:  # the requests fail; the worker goes on
                results = [e] * len(batch)
            finally:
                with self.cond:
                    self.busy -= 1
            for job, result in zip(batch, results):
                job.request.deliver(job.index, result)
            self.last_done[worker] = time.monotonic()
            self.last_size[worker] = len(batch) or math.inf
