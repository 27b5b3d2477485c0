"""`mtx bench serve`: a load test of `mtx serve` on 127.0.0.1, against the batch CLI.

    mtx bench serve --checkpoint CKPT --src data/multi30k/test2016.en

1. `mtx translate`'s search on the whole file in one process (Translator.translate, the CLI's
   code, after a warm-up, timed by the harness): sentences/s and target tokens/s.
2. Servers (--modes), each in its own process: `batched` (serve.* as given: by default one
   decoding process per core), `one-decoder` (batching, serve.workers 1: one decoding process
   with every core's threads), `unbatched` (serve.batching false and serve.workers 1: one
   request at a time, as servers that serialise requests do) and `ctranslate2` (--engine
   ctranslate2): first the seconds from its launch to /ready, and the share of lines it
   translates as `mtx translate` does (also its warm-up); then for each client count
   (--clients), that many threads each send one request at a time (--lines-per-request lines
   of the file, in turn) over a kept-alive connection, at most --requests requests or
   --seconds seconds in all. Reported: sentences/s, target tokens/s (the server's
   mtx_tokens_out_total), p50/p95/p99 latency, mean batch size (mtx_batch_sentences), the
   server's busy cores (the CPU time of its process and of its decoding processes over the
   load's wall time), the client cores (this benchmark's client threads, which run on the same
   cores) and errors.
3. With --memory-requests N: the `batched` server's memory (the harness's measure: PSS of the
   server's process and its decoding processes, in all and each) after a warm-up of 500
   requests and after N more at 16 clients.

Only loopback is used, and every stage is bounded in requests and time.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtx.bench.harness import (
    cpu_seconds,
    describe_machine,
    machine,
    memory,
    result,
    timed,
    tree,
)
from mtx.bench.server import Server
from mtx.errors import MtxError

MODES = {  # --set for each server
    "batched": [],
    "one-decoder": ["serve.workers=1"],
    "unbatched": ["serve.batching=false", "serve.workers=1"],
    "ctranslate2": [],
}
COLUMNS = (
    "| server | clients | sentences/s | target tok/s | vs CLI | p50 ms | p95 ms | p99 ms "
    "| mean batch | server cores | client cores | errors |"
)


def cli_baseline(checkpoint: Path, lines: list[str]) -> tuple[dict, list[str]]:
    """`mtx translate`'s speed on `lines` (after a warm-up on 64 of them), and its outputs."""
    from mtx.decode.translator import Translator

    tr = Translator.from_checkpoints(checkpoint, device="cpu")
    tr.translate(lines[:64])  # warm-up
    timing, done = timed(lambda: tr.translate(lines), repeats=1, warmup=0)
    out = [t.best.text for t in done]
    tokens = sum(len(tr.parts.codec.vocab.target.encode(x)) for x in out)
    seconds = timing.median
    rate = {"sentences_s": len(lines) / seconds, "tokens_s": tokens / seconds, "seconds": seconds}
    return rate, out


def agreement(server: Server, lines: list[str], expected: list[str], size: int = 8) -> float:
    """The share of lines whose server translation equals `mtx translate`'s."""
    same = 0
    for i in range(0, len(lines), size):
        status, answer = server.translate(lines[i : i + size])
        if status != 200:
            raise RuntimeError(f"the server answered {status}: {answer}")
        same += sum(a == b for a, b in zip(answer["translations"], expected[i : i + size]))
    return same / len(lines)


class Clients:
    """`clients` threads, each sending one request at a time over a kept-alive connection,
    until `requests` in all or `seconds`; the latencies of the answered ones and the errors."""

    def __init__(self, port: int, lines: list[str], per_request: int, requests: int,
                 seconds: float) -> None:  # fmt: skip
        self.port, self.lines, self.per_request = port, lines, per_request
        self.requests, self.deadline = requests, time.monotonic() + seconds
        self.lock = threading.Lock()
        self.next = self.sent = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def take(self) -> list[str] | None:
        """The next request's texts, or None when the load is over."""
        with self.lock:
            if self.sent >= self.requests or time.monotonic() >= self.deadline:
                return None
            self.sent += 1
            i, n = self.next, len(self.lines)
            self.next = (i + self.per_request) % n
        return [self.lines[(i + k) % n] for k in range(self.per_request)]

    def client(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        while (texts := self.take()) is not None:
            body = json.dumps({"text": texts}).encode()
            start = time.perf_counter()
            conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            took = time.perf_counter() - start
            with self.lock:
                if reply.status == 200:
                    self.latencies.append(took)
                else:
                    self.errors.append(f"{reply.status} {data[:100]!r}")
        conn.close()

    def run(self, count: int) -> float:
        """Run `count` clients to the end; the wall seconds."""
        threads = [threading.Thread(target=self.client) for _ in range(count)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start


def server_counters(server: Server) -> dict[str, float]:
    names = ("mtx_batch_sentences_count", "mtx_batch_sentences_sum", "mtx_tokens_out_total")
    return {name: server.metric(name) for name in names}


def load(server: Server, lines, clients: int, per_request: int, requests: int, seconds: float):
    """The figures of one load: `clients` clients, until `requests` or `seconds`."""
    before, cpu_before = server_counters(server), cpu_seconds(tree(server.proc.pid))
    own_before = time.process_time()
    load = Clients(server.port, lines, per_request, requests, seconds)
    wall = load.run(clients)
    own = time.process_time() - own_before
    cpu, after = cpu_seconds(tree(server.proc.pid)), server_counters(server)
    batches = after["mtx_batch_sentences_count"] - before["mtx_batch_sentences_count"]
    sentences = after["mtx_batch_sentences_sum"] - before["mtx_batch_sentences_sum"]
    q = statistics.quantiles(load.latencies, n=100) if len(load.latencies) > 1 else [0.0] * 99
    return {
        "clients": clients,
        "requests": len(load.latencies),
        "errors": len(load.errors),
        "first_error": load.errors[0] if load.errors else None,
        "sentences_s": len(load.latencies) * per_request / wall,
        "tokens_s": (after["mtx_tokens_out_total"] - before["mtx_tokens_out_total"]) / wall,
        "p50_ms": 1000 * q[49],
        "p95_ms": 1000 * q[94],
        "p99_ms": 1000 * q[98],
        "mean_batch": sentences / batches if batches else 0.0,
        "seconds": wall,
        "client_cores": own / wall,  # this benchmark's client threads, on the same cores
        # CPU time of the server and its decoding processes over the load, by process
        "server_cores": {
            pid: (cpu[pid] - cpu_before.get(pid, 0.0)) / wall for pid in cpu if pid in cpu_before
        },
    }


def cores(r: dict) -> str:
    """The server's cores busy over a load, in all, then the main process's and each other
    busy one's, e.g. "1.74 (0.17 + 0.76 + 0.81)"."""
    by = list(r["server_cores"].values())
    busy = [by[0]] + [v for v in by[1:] if v >= 0.01]  # not multiprocessing's tracker
    return f"{sum(by):.2f} ({' + '.join(f'{v:.2f}' for v in busy)})"


def row(mode: str, r: dict, cli: dict) -> str:
    return (
        f"| {mode} | {r['clients']} | {r['sentences_s']:.1f} | {r['tokens_s']:.0f} | "
        f"{r['sentences_s'] / cli['sentences_s']:.2f}x | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} "
        f"| {r['p99_ms']:.0f} | {r['mean_batch']:.1f} | {cores(r)} | {r['client_cores']:.2f} | "
        f"{r['errors']} |"
    )


def memory_over(server: Server, lines: list[str], per_request: int, requests: int) -> dict:
    """The server's memory after a warm-up of 500 requests at 16 clients, and after
    `requests` more."""
    load(server, lines, 16, per_request, 500, 600)
    decoders = server.decoders()
    by_process = {p: memory([p]).pss for p in [server.proc.pid, *decoders]}
    before = memory(tree(server.proc.pid)).pss
    r = load(server, lines, 16, per_request, requests, 3600)
    after = memory(tree(server.proc.pid)).pss
    mb = 2**20
    return {
        "requests": r["requests"],
        "errors": r["errors"],
        "pss_before_mb": before / mb,
        "pss_after_mb": after / mb,
        "server_process_mb": by_process[server.proc.pid] / mb,
        "decoding_processes_mb": [by_process[p] / mb for p in decoders],
    }


def memory_line(m: dict) -> str:
    decoders = " + ".join(f"{x:.0f}" for x in m["decoding_processes_mb"])
    return (
        f"memory (PSS): {m['pss_before_mb']:.0f} MB after warm-up (the server's process "
        f"{m['server_process_mb']:.0f}, its decoding processes {decoders}), "
        f"{m['pss_after_mb']:.0f} MB after {m['requests']} more requests "
        f"({m['pss_after_mb'] - m['pss_before_mb']:+.0f} MB), {m['errors']} errors"
    )


@dataclass
class Options:
    """What `mtx bench serve` is asked for (its flags)."""

    checkpoint: Path
    src: Path  # sentences to send, one per line
    lines: int = 0  # use the first N lines (0: all)
    clients: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    lines_per_request: int = 1
    requests: int = 1000  # at most, per client count
    seconds: float = 60.0  # at most, per client count
    modes: list[str] = field(default_factory=lambda: list(MODES))
    memory_requests: int = 0  # the batched server's memory after this many more requests
    sets: list[str] = field(default_factory=list)  # more --set for the servers
    json: Path | None = None  # also write the JSON result here

    def check(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise MtxError(f"--modes: no mode {unknown[0]!r} (modes: {', '.join(MODES)})")


def serve_mode(o: Options, mode: str, lines: list[str], expected: list[str], report: dict) -> None:
    """One server: its start, its agreement with the CLI, each client count, its memory."""
    sets = [*MODES[mode], *o.sets]
    engine = ("--engine", "ctranslate2") if mode == "ctranslate2" else ()
    start = time.perf_counter()
    with Server(o.checkpoint, *sets, "serve.max_queue=100000", args=engine) as server:
        started = time.perf_counter() - start
        same = agreement(server, lines, expected)  # also the warm-up
        report.setdefault("same_as_cli", {})[mode] = same
        report.setdefault("start_s", {})[mode] = started
        print(f"{mode}: ready {started:.2f} s after its launch; {100 * same:.1f}% of lines "
              "the same as mtx translate", flush=True)  # fmt: skip
        for n in o.clients:
            r = load(server, lines, n, o.lines_per_request, o.requests, o.seconds)
            report.setdefault(mode, []).append(r)
            print(row(mode, r, report["cli"]), flush=True)
        if mode == "batched" and o.memory_requests:
            m = memory_over(server, lines, o.lines_per_request, o.memory_requests)
            report["memory"] = m
            print(memory_line(m), flush=True)
        if server.stop() != 0:
            raise RuntimeError(f"the {mode} server did not exit 0")


def run(o: Options) -> None:
    """`mtx bench serve`: each server's lines printed as they are measured, and the JSON
    result written to `o.json` if given."""
    o.check()
    lines = o.src.read_text(encoding="utf-8").splitlines()
    lines = lines[: o.lines] if o.lines else lines
    report: dict = {"lines": len(lines), "lines_per_request": o.lines_per_request}
    report["cli"], expected = cli_baseline(o.checkpoint, lines)
    cli = report["cli"]
    print(f"{describe_machine(machine())}\nmtx translate (one process): "
          f"{cli['sentences_s']:.1f} sentences/s, {cli['tokens_s']:.0f} target tokens/s\n"
          f"{COLUMNS}", flush=True)  # fmt: skip
    for mode in o.modes:
        serve_mode(o, mode, lines, expected, report)
    if o.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()}
        o.json.write_text(json.dumps(result("serve", report, **settings), indent=2) + "\n")
