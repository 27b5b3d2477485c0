"""Load test of `mtx serve` on 127.0.0.1: throughput and latency against the batch CLI.

    python scripts/bench_serve.py --checkpoint CKPT --src ../shared/data/multi30k/test2016.en

1. `mtx translate`'s search on the whole file in one process (Translator.translate, the CLI's
   code, after a warm-up): sentences/s and target tokens/s.
2. Servers (--modes), each in its own process: `batched` (serve.* as given: by default one
   decoding process per core), `one-decoder` (batching, serve.workers 1: one decoding process
   with every core's threads), `unbatched` (serve.batching false and serve.workers 1: one
   request at a time, as servers that serialise requests do) and `ctranslate2` (--engine
   ctranslate2): first the seconds from its launch to /ready, and the share of lines it
   translates as `mtx translate` does (also its warm-up); then for each
   client count (--clients), that many threads each send one request at a time
   (--lines-per-request lines of the file, in turn) over a kept-alive connection, at most
   --requests requests or --seconds seconds in all. Reported: sentences/s,
   target tokens/s (the server's mtx_tokens_out_total), p50/p95/p99 latency, mean batch size
   (mtx_batch_sentences), the server's busy cores (the CPU time of its process and of its
   decoding processes over the load's wall time), the client cores (this script's client
   threads, which run on the same cores) and errors.
3. With --memory-requests N: the `batched` server's resident memory (VmRSS of the server and
   its decoding processes, in all and the server's process and each decoding process after the
   warm-up) after a warm-up and after N more requests at 16 clients.

Only loopback is used, and every stage is bounded in requests and time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.server import Server  # noqa: E402


def cli_baseline(checkpoint: Path, lines: list[str]) -> dict:
    from mtx.decode.translator import Translator

    tr = Translator.from_checkpoint(checkpoint, device="cpu")
    tr.translate(lines[:64])  # warm-up
    start = time.perf_counter()
    out = tr.translate(lines)
    seconds = time.perf_counter() - start
    tokens = sum(len(tr.sp.encode(x)) for x in out)
    rate = {"sentences_s": len(lines) / seconds, "tokens_s": tokens / seconds, "seconds": seconds}
    return rate, out


def agreement(server: Server, lines: list[str], expected: list[str], size: int = 8) -> float:
    """The share of lines whose server translation equals `mtx translate`'s."""
    same = 0
    for i in range(0, len(lines), size):
        status, answer = server.translate(lines[i : i + size])
        assert status == 200, answer
        same += sum(a == b for a, b in zip(answer["translations"], expected[i : i + size]))
    return same / len(lines)


def load(server: Server, lines, clients: int, per_request: int, requests: int, seconds: float):
    """`clients` threads, one request at a time each, until `requests` or `seconds`."""
    lock = threading.Lock()
    state = {"next": 0, "sent": 0}
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        while time.monotonic() < deadline:
            with lock:
                if state["sent"] >= requests:
                    break
                state["sent"] += 1
                i = state["next"]
                state["next"] = (i + per_request) % len(lines)
            texts = [lines[(i + k) % len(lines)] for k in range(per_request)]
            body = json.dumps({"text": texts}).encode()
            start = time.perf_counter()
            conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            took = time.perf_counter() - start
            with lock:
                if reply.status == 200:
                    latencies.append(took)
                else:
                    errors.append(f"{reply.status} {data[:100]!r}")
        conn.close()

    before = metrics(server)
    cpu_before = cpu_seconds(server.proc.pid)
    own_before = time.process_time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    own = time.process_time() - own_before
    cpu = cpu_seconds(server.proc.pid)
    after = metrics(server)
    done = len(latencies) * per_request
    batches = after["mtx_batch_sentences_count"] - before["mtx_batch_sentences_count"]
    sentences = after["mtx_batch_sentences_sum"] - before["mtx_batch_sentences_sum"]
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "sentences_s": done / wall,
        "tokens_s": (after["mtx_tokens_out_total"] - before["mtx_tokens_out_total"]) / wall,
        "p50_ms": 1000 * q[49],
        "p95_ms": 1000 * q[94],
        "p99_ms": 1000 * q[98],
        "mean_batch": sentences / batches if batches else 0.0,
        "seconds": wall,
        "client_cores": own / wall,  # this script's client threads, on the same cores
        # CPU time of the server and its decoding processes over the load, by process
        "server_cores": {
            pid: (cpu[pid] - cpu_before.get(pid, 0.0)) / wall for pid in cpu if pid in cpu_before
        },
    }


def metrics(server: Server) -> dict[str, float]:
    names = ("mtx_batch_sentences_count", "mtx_batch_sentences_sum", "mtx_tokens_out_total")
    return {name: server.metric(name) for name in names}


def tree(pid: int) -> list[int]:
    """Process `pid` and its descendants."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            out += tree(int(child))
    return out


def cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of process `pid` and of each of its descendants."""
    out = {}
    for p in tree(pid):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        out[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def rss_mb(pid: int) -> dict[int, float]:
    """VmRSS of process `pid` and of each of its descendants, in MB."""
    out = {}
    for p in tree(pid):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out[p] = int(line.split()[1]) / 1024
    return out


MODES = {  # --set for each server
    "batched": [],
    "one-decoder": ["serve.workers=1"],
    "unbatched": ["serve.batching=false", "serve.workers=1"],
    "ctranslate2": [],
}


def cores(r: dict) -> str:
    """The server's cores busy over a load, in all, then the main process's and each other
    busy one's, e.g. "1.74 (0.17 + 0.76 + 0.81)"."""
    by = [v for v in r["server_cores"].values()]
    busy = [by[0]] + [v for v in by[1:] if v >= 0.01]  # not multiprocessing's tracker
    return f"{sum(by):.2f} ({' + '.join(f'{v:.2f}' for v in busy)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--lines", type=int, default=0, help="Use the first N lines (0 = all).")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--lines-per-request", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1000, help="At most, per client count.")
    ap.add_argument("--seconds", type=float, default=60.0, help="At most, per client count.")
    ap.add_argument("--modes", default="batched,one-decoder,unbatched,ctranslate2")
    ap.add_argument("--memory-requests", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="More --set for the servers.")
    ap.add_argument("--json", type=Path, help="Also write the figures here.")
    args = ap.parse_args()
    lines = args.src.read_text(encoding="utf-8").splitlines()
    lines = lines[: args.lines] if args.lines else lines
    clients = [int(x) for x in args.clients.split(",")]
    report: dict = {"lines": len(lines), "lines_per_request": args.lines_per_request}
    report["cli"], expected = cli_baseline(args.checkpoint, lines)
    cli = report["cli"]
    print(f"mtx translate (one process): {cli['sentences_s']:.1f} sentences/s, "
          f"{cli['tokens_s']:.0f} target tokens/s", flush=True)  # fmt: skip
    print("| server | clients | sentences/s | target tok/s | vs CLI | p50 ms | p95 ms | p99 ms "
          "| mean batch | server cores | client cores | errors |", flush=True)  # fmt: skip
    for mode in args.modes.split(","):
        sets = [*MODES[mode], *args.set]
        engine = ("--engine", "ctranslate2") if mode == "ctranslate2" else ()
        start = time.perf_counter()
        with Server(args.checkpoint, *sets, "serve.max_queue=100000", args=engine) as server:
            started = time.perf_counter() - start
            same = agreement(server, lines, expected)  # also the warm-up
            report.setdefault("same_as_cli", {})[mode] = same
            report.setdefault("start_s", {})[mode] = started
            print(f"{mode}: ready {started:.2f} s after its launch; {100 * same:.1f}% of lines "
                  "the same as mtx translate", flush=True)  # fmt: skip
            for n in clients:
                r = load(server, lines, n, args.lines_per_request, args.requests, args.seconds)
                report.setdefault(mode, []).append(r)
                print(f"| {mode} | {n} | {r['sentences_s']:.1f} | {r['tokens_s']:.0f} | "
                      f"{r['sentences_s'] / cli['sentences_s']:.2f}x | {r['p50_ms']:.0f} | "
                      f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {r['mean_batch']:.1f} | "
                      f"{cores(r)} | {r['client_cores']:.2f} | {r['errors']} |", flush=True)  # fmt: skip
            if mode == "batched" and args.memory_requests:
                load(server, lines, 16, args.lines_per_request, 500, 600)
                by_process = rss_mb(server.proc.pid)
                before = sum(by_process.values())
                r = load(server, lines, 16, args.lines_per_request, args.memory_requests, 3600)
                after = sum(rss_mb(server.proc.pid).values())
                decoders = [by_process[p] for p in server.decoders()]
                report["memory"] = {"requests": r["requests"], "rss_before_mb": before,
                                    "rss_after_mb": after, "errors": r["errors"],
                                    "server_process_mb": by_process[server.proc.pid],
                                    "decoding_processes_mb": decoders}  # fmt: skip
                print(f"memory: {before:.0f} MB after warm-up (the server's process "
                      f"{by_process[server.proc.pid]:.0f}, its decoding processes "
                      f"{' + '.join(f'{m:.0f}' for m in decoders)}), {after:.0f} MB after "
                      f"{r['requests']} more requests ({after - before:+.0f} MB), "
                      f"{r['errors']} errors", flush=True)  # fmt: skip
            assert server.stop() == 0
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
