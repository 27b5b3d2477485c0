"""The serve batcher (mtx/serve/batcher.py) with a fake engine: what goes in which batch."""

import asyncio
import signal
import threading

import pytest

from mtx.decode.options import Options
from mtx.decode.result import Output, Translation
from mtx.serve.batcher import Batcher, QueueFull, ShuttingDown
from mtx.serve.batcher import Request as Pending
from mtx.serve.front import Result

GREEDY, BEAM = Options(beam=1), Options(beam=4)
FOREVER = 3600.0  # a batch never goes for want of waiting: only a full budget or a drain sends it


class Recorder:
    """A fake engine that records its batches; `gate` holds each batch until released."""

    def __init__(self, gated: bool = False) -> None:
        self.batches: list[tuple[list[str], Options]] = []
        self.gate = threading.Semaphore(0) if gated else None
        self.started = threading.Event()

    def __call__(self, texts: list[str], options: Options) -> list[Result]:
        self.started.set()
        if self.gate is not None:
            self.gate.acquire()
        self.batches.append((list(texts), options))
        return [answer(t.upper(), float(len(t))) for t in texts]


async def submit(batcher, texts, options=GREEDY, length=8):
    pending = Pending(asyncio.get_running_loop(), len(texts))
    batcher.submit(pending, texts, [length] * len(texts), options)
    return pending


def answer(text: str, score: float = 0.0) -> Result:
    return Result(Translation((Output(text, score),)))


def run(coro):
    return asyncio.run(coro)


def test_a_long_request_spans_batches_and_comes_back_in_order():
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=24, max_wait_s=0.0, max_queue=100)
        b.start()
        texts = [f"t{i}" for i in range(10)]
        pending = await submit(b, texts)
        results = await pending.future
        b.stop()
        return texts, results

    texts, results = run(main())
    assert [r.translation.best.text for r in results] == [t.upper() for t in texts]
    assert [len(batch) for batch, _ in engine.batches] == [3, 3, 3, 1]  # 24 tokens: 3 of 8


def test_requests_with_the_same_options_share_a_batch_and_others_wait_their_turn():
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=32, max_wait_s=FOREVER, max_queue=100)
        b.start()
        a = await submit(b, ["a1", "a2"])
        c = await submit(b, ["c1"], BEAM)  # other options: not in a greedy batch
        d = await submit(b, ["d1", "d2"])  # the greedy budget is full now: a1 a2 d1 d2 go
        first = await asyncio.gather(a.future, d.future)
        b.drain()  # stop waiting to fill: c goes alone
        await c.future
        b.stop()
        return first

    run(main())
    assert engine.batches == [(["a1", "a2", "d1", "d2"], GREEDY), (["c1"], BEAM)]


def test_without_batching_each_request_is_decoded_alone():
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=1000, max_wait_s=FOREVER, max_queue=100, batching=False)
        b.start()
        futures = [(await submit(b, [f"r{i}a", f"r{i}b"])).future for i in range(3)]
        await asyncio.gather(*futures)
        b.stop()

    run(main())
    assert [batch for batch, _ in engine.batches] == [
        ["r0a", "r0b"],
        ["r1a", "r1b"],
        ["r2a", "r2b"],
    ]


def test_a_full_queue_refuses_a_request_whole_and_a_draining_one_refuses_all():
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=1000, max_wait_s=FOREVER, max_queue=3)
        b.start()
        first = await submit(b, ["a", "b"])
        with pytest.raises(QueueFull, match="max_queue is 3"):
            await submit(b, ["c", "d"])
        assert b.depth() == 2  # nothing of the refused request was queued
        b.drain()
        with pytest.raises(ShuttingDown):
            await submit(b, ["e"])
        results = await first.future  # drained: what was queued is still answered
        b.stop()
        return results

    assert [r.translation.best.text for r in run(main())] == ["A", "B"]


def test_a_cancelled_request_leaves_the_queue_and_stop_fails_what_is_left():
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=1000, max_wait_s=FOREVER, max_queue=10)
        b.start()
        gone = await submit(b, ["x", "y"])
        kept = await submit(b, ["z"])
        b.cancel(gone)
        assert b.depth() == 1
        b.stop()
        with pytest.raises(ShuttingDown):
            await kept.future

    run(main())
    assert engine.batches == []  # nothing was decoded


def test_a_worker_waiting_on_a_cancelled_request_waits_for_the_next_one_instead():
    """The worker waits to fill a greedy batch for `gone`; once `gone` is cancelled (timed
    out), it forms its batches around what is queued next (a beam batch that fills)."""
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=32, max_wait_s=FOREVER, max_queue=10)
        b.start()
        gone = await submit(b, ["x"])
        while not b.forming:  # the worker is waiting for `gone`'s batch to fill
            await asyncio.sleep(0.001)
        b.cancel(gone)
        beam = await submit(b, ["b1", "b2"], BEAM, length=16)  # a full budget of its own
        results = await asyncio.wait_for(beam.future, 20)  # a hang guard, not a timing
        b.stop()
        return results

    assert [r.translation.best.text for r in run(main())] == ["B1", "B2"]
    assert engine.batches == [(["b1", "b2"], BEAM)]


def test_a_failing_batch_fails_its_requests_and_the_worker_goes_on():
    calls = []

    def engine(texts, options):
        calls.append(texts)
        if texts == ["bad"]:
            raise RuntimeError("boom")
        return [answer(t) for t in texts]

    async def main():
        b = Batcher(engine, batch_tokens=8, max_wait_s=0.0, max_queue=10)
        b.start()
        bad = await submit(b, ["bad"])
        with pytest.raises(RuntimeError, match="boom"):
            await bad.future
        good = await submit(b, ["good"])
        results = await good.future
        b.stop()
        return results

    assert run(main())[0].translation.best.text == "good"


def test_the_event_loop_is_free_while_a_batch_decodes():
    engine = Recorder(gated=True)

    async def main():
        b = Batcher(engine, batch_tokens=8, max_wait_s=0.0, max_queue=10)
        b.start()
        pending = await submit(b, ["slow"])
        while not engine.started.is_set():  # the worker is inside the engine, held by the gate
            await asyncio.sleep(0.001)
        ticks = 0
        for _ in range(5):  # the loop runs other work meanwhile
            await asyncio.sleep(0)
            ticks += 1
        assert not pending.future.done()
        engine.gate.release()
        await pending.future
        b.stop()
        return ticks

    assert run(main()) == 5


def test_idle_workers_share_the_queue_and_a_busy_one_leaves_it_to_the_others():
    """Two workers: eight sentences queued while both are idle go half to each; once one is
    busy, the other takes all that is queued (within the budget)."""
    first, second = Recorder(gated=True), Recorder(gated=True)

    async def main():
        b = Batcher([first, second], batch_tokens=1000, max_wait_s=FOREVER, max_queue=100)
        b.start()
        requests = [await submit(b, [f"a{i}"]) for i in range(8)]
        b.drain()  # stop waiting to fill: the queue goes now, shared by the idle workers
        while not (first.started.is_set() and second.started.is_set()):
            await asyncio.sleep(0.001)
        assert b.busy_workers() == 2 and b.depth() == 0
        first.gate.release()
        second.gate.release()
        results = await asyncio.gather(*(r.future for r in requests))
        b.stop()
        return results

    results = run(main())
    assert [r[0].translation.best.text for r in results] == [f"A{i}" for i in range(8)]
    sizes = sorted(len(batch) for engine in (first, second) for batch, _ in engine.batches)
    assert sizes == [4, 4]

    engines = [Recorder(gated=True), Recorder(gated=True)]

    async def one_busy():
        b = Batcher(engines, batch_tokens=1000, max_wait_s=0.0, max_queue=100)
        b.start()
        held = await submit(b, ["x"])
        while not any(engine.started.is_set() for engine in engines):
            await asyncio.sleep(0.001)
        busy, idle = engines if engines[0].started.is_set() else engines[::-1]
        idle.gate.release()
        rest = await submit(b, [f"r{i}" for i in range(6)])
        await rest.future
        busy.gate.release()
        await held.future
        b.stop()
        return busy, idle

    busy, idle = run(one_busy())
    assert busy.batches == [(["x"], GREEDY)]
    assert idle.batches == [([f"r{i}" for i in range(6)], GREEDY)]


def test_a_worker_stops_waiting_once_as_many_sentences_as_its_last_batch_are_queued():
    """The clients a batch answered send their next lines: once as many are queued, the next
    batch goes at once (a closed loop of clients waits no longer than they take)."""
    engine = Recorder()

    async def main():
        b = Batcher(engine, batch_tokens=48, max_wait_s=FOREVER, max_queue=100)
        b.start()
        first = await submit(b, ["a", "b", "c"], length=16)  # 48 tokens: the budget sends it
        await first.future
        second = await submit(b, ["d", "e"])  # 16 tokens: 2 of the 3 the last batch held
        third = await submit(b, ["f"])  # 3 queued (24 tokens): they go, the budget not full
        # a hang guard, not a timing: without the rule the batch would wait FOREVER
        results = [await asyncio.wait_for(p.future, 20) for p in (second, third)]
        b.stop()
        return [[r.translation.best.text for r in rs] for rs in results]

    assert run(main()) == [["D", "E"], ["F"]]
    assert [batch for batch, _ in engine.batches] == [["a", "b", "c"], ["d", "e", "f"]]


def test_the_worker_idle_longest_takes_the_next_batch():
    """Two workers: batches go to them in turn, even though each batch ends before the next
    comes (the worker that has just finished would otherwise be as likely to take it); the
    batcher is running (/ready) once both have come for work."""
    engines = [Recorder(), Recorder()]

    async def both_waiting(b):
        while len(b.waiting_workers()) < 2:  # a state to reach, not a time to wait
            await asyncio.sleep(0.001)
        return b.waiting_workers()

    async def main():
        b = Batcher(engines, batch_tokens=1000, max_wait_s=0.0, max_queue=100)
        assert not b.running
        b.start()
        turns = []
        for i in range(4):
            turns.append((await both_waiting(b))[0])
            assert b.running  # /ready: every worker has come for work
            await (await submit(b, [f"t{i}"])).future
        b.drain()
        assert not b.running
        b.stop()
        return turns

    turns = run(main())
    assert turns[0] != turns[1] and turns[2:] == turns[:2]
    assert [batch for batch, _ in engines[turns[0]].batches] == [["t0"], ["t2"]]
    assert [batch for batch, _ in engines[turns[1]].batches] == [["t1"], ["t3"]]


def test_a_signal_taken_by_another_thread_still_drains_the_main_thread_s_worker():
    """As in `mtx serve`: the first worker runs in the main thread, stalled on a batch that
    waits for more, and SIGTERM's handler drains the batcher. The kernel may deliver the
    signal to another thread (here: sent to one); Python runs the handler in the main thread
    once it looks up from its wait, within WAKE_S, and the queued batch is decoded rather
    than left until max_wait_s (an hour) or a request's timeout."""
    engine = Recorder()
    b = Batcher(engine, batch_tokens=1000, max_wait_s=FOREVER, max_queue=10)
    loop = asyncio.new_event_loop()
    b.submit(Pending(loop, 1), ["a"], [8], GREEDY)

    def signaller():
        while not b.forming:  # the main thread's worker is waiting for its batch to fill
            threading.Event().wait(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread
        if not engine.started.wait(60):  # a failing run ends instead of hanging
            b.stop()

    before = signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=b.drain).start())
    try:
        thread = threading.Thread(target=signaller)
        thread.start()
        b.work()
        thread.join()
    finally:
        signal.signal(signal.SIGTERM, before)
        loop.close()
    assert engine.batches == [(["a"], GREEDY)]
