"""What a server pays on the CPU, measured in one process (BENCHMARKS.md, "Serving").

    python scripts/serve_causes.py --checkpoint CKPT --src ../shared/data/multi30k/test2016.en

1. `Translator.translate` at fixed batch sizes (lines taken in order) and on the whole file,
   each with sources of several padded lengths decoded together (what mtx does,
   model/groups.py) and, interleaved in the same run, with one padded length per search (the
   model's `mixes_lengths` turned off): best of --repeats.
2. The same search called from the main thread and from a secondary thread: one sentence at a
   time (40 lines) and one batch of 256 lines.
3. A real `mtx serve` on 127.0.0.1: 60 one-line requests in a row over one kept-alive
   connection (the latency TCP_NODELAY decides), serve.max_wait_ms 0.
4. The search's steps (the time from one decoder call to the next: the decoder and the
   beam's bookkeeping) in batches of 1 and 16 lines drawn at random: the median by the number
   of hypotheses decoded, and in batches of 16 the steps a batch and the share of its rows
   still decoding (a finished sentence leaves; the step's fixed cost stays).
5. The most any server could reach with this search at --ceiling-batch sentences a batch (16
   one-line clients over 2 decoding processes give batches of 6 to 8): --processes processes
   of one thread each, with no server, no HTTP and no clients, decode batches of that many
   random lines back to back, all at once; sentences/s in all beside the whole file in this
   process with --processes threads (what the load test's "vs CLI" divides by).

--parts picks which to run (default 1-4).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.server import Server  # noqa: E402


def rate(tr, lines: list[str], size: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(lines), size):
        tr.translate(lines[i : i + size])
    return len(lines) / (time.perf_counter() - start)


def threads(tr, lines: list[str]) -> dict[str, tuple[float, float]]:
    """(ms per sentence alone, sentences/s in a 256-line batch), main thread and another."""
    out = {}

    def run(name: str) -> None:
        tr.translate(lines[:4])
        alone = 1000 / rate(tr, lines[:40], 1)
        out[name] = (alone, rate(tr, lines[:256], 256))

    run("main thread")
    thread = threading.Thread(target=run, args=("secondary thread",))
    thread.start()
    thread.join()
    return out


def kept_alive_ms(checkpoint: Path, lines: list[str]) -> float:
    with Server(checkpoint, "serve.max_wait_ms=0") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port)
        headers = {"Content-Type": "application/json"}

        def one(line: str) -> None:
            conn.request("POST", "/translate", json.dumps({"text": [line]}).encode(), headers)
            conn.getresponse().read()

        for line in lines[:10]:
            one(line)
        start = time.perf_counter()
        for line in lines[:60]:
            one(line)
        took = (time.perf_counter() - start) / 60
        conn.close()
        assert server.stop() == 0
    return 1000 * took


def steps(tr, lines: list[str], size: int, batches: int) -> list[tuple[int, float]]:
    """(hypotheses, seconds) of every step but each search's last, batches of `size` lines."""
    out, last = [], [0.0, 0]
    decode = tr.model.decode

    def timed(tgt_in, *args, **kwargs):
        now = time.perf_counter()
        if last[0]:
            out.append((last[1], now - last[0]))
        last[0], last[1] = now, tgt_in.size(0)
        return decode(tgt_in, *args, **kwargs)

    rng = random.Random(0)
    tr.model.decode = timed
    try:
        for _ in range(batches):
            last[0] = 0.0
            tr.translate(rng.sample(lines, size))
    finally:
        del tr.model.decode
    return out


def sizes(tr, lines: list[str], repeats: int) -> None:
    for size, n in ((1, 128), (4, 128), (16, 256), (64, 512), (len(lines), len(lines))):
        best = {True: 0.0, False: 0.0}
        for _ in range(repeats):
            for mix in best:
                tr.model.mixes_lengths = mix
                best[mix] = max(best[mix], rate(tr, lines[:n], size))
        name = "whole file" if size == len(lines) else f"batches of {size} (lines 0-{n - 1})"
        print(f"{name}: {best[True]:.1f} sentences/s, {best[False]:.1f} one length per search")
    tr.model.mixes_lengths = True


def step_times(tr, lines: list[str]) -> None:
    beam = tr.cfg.decode.beam
    alone = steps(tr, lines, 1, 64)
    sixteen = steps(tr, lines, 16, 32)
    ms = statistics.median(1000 * s for n, s in alone if n == beam)
    print(f"a step with one sentence ({beam} hypotheses): median {ms:.2f} ms")
    full = [1000 * s for n, s in sixteen if n > 8 * beam]
    print(f"a step with 9-16 sentences: median {statistics.median(full):.2f} ms")
    live = sum(n for n, _ in sixteen) / (len(sixteen) * 16 * beam)
    print(f"batches of 16: {len(sixteen) / 32 + 1:.1f} steps a batch, {live:.0%} of rows live")


def _decode_back_to_back(checkpoint, lines, size, batches, seed, start, out) -> None:
    """One process of part 5: warm up, wait for the others, then `batches` random batches."""
    import torch

    from mtx.decode.translator import Translator

    torch.set_num_threads(1)
    tr = Translator.from_checkpoint(checkpoint, device="cpu")
    rng = random.Random(seed)
    for _ in range(5):
        tr.translate(rng.sample(lines, size))
    start.wait()
    began = time.perf_counter()
    for _ in range(batches):
        tr.translate(rng.sample(lines, size))
    out.put((began, time.perf_counter()))


def ceiling(tr, checkpoint: Path, lines: list[str], processes: int, size: int) -> None:
    import torch

    torch.set_num_threads(processes)
    whole = max(rate(tr, lines, len(lines)) for _ in range(2))
    batches = 1200 // size
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(
            target=_decode_back_to_back, args=(checkpoint, lines, size, batches, i, start, out)
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    spans = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(end for _, end in spans) - min(began for began, _ in spans)
    total = processes * batches * size / wall
    print(f"{processes} processes of 1 thread, batches of {size} random lines back to back, no "
          f"server: {total:.1f} sentences/s in all; the whole file with {processes} threads: "
          f"{whole:.1f} sentences/s; ratio {total / whole:.2f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--parts", default="1,2,3,4")
    ap.add_argument("--processes", type=int, default=2, help="part 5")
    ap.add_argument("--ceiling-batch", type=int, nargs="+", default=[8], help="part 5")
    args = ap.parse_args()
    from mtx.decode.translator import Translator

    lines = args.src.read_text(encoding="utf-8").splitlines()
    tr = Translator.from_checkpoint(args.checkpoint, device="cpu")
    tr.translate(lines[:32])  # warm-up
    parts = {int(x) for x in args.parts.split(",")}
    if 1 in parts:
        sizes(tr, lines, args.repeats)
    if 2 in parts:
        for name, (alone, batched) in threads(tr, lines).items():
            print(f"{name}: {alone:.1f} ms a sentence alone, {batched:.0f} sentences/s in 256")
    if 3 in parts:
        print(f"kept-alive connection: {kept_alive_ms(args.checkpoint, lines):.1f} ms a request")
    if 4 in parts:
        step_times(tr, lines)
    if 5 in parts:
        for size in args.ceiling_batch:
            ceiling(tr, args.checkpoint, lines, args.processes, size)


if __name__ == "__main__":
    main()
