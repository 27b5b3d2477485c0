"""A real `mtx serve` process on 127.0.0.1 and a real HTTP client: what the serving benchmark
(serve.py) loads and what tests/test_serve.py talks to."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

START_TIMEOUT_S = 120


class Server:
    """`mtx serve --port 0 ...` started in a subprocess; `port` is read from its first line."""

    def __init__(
        self,
        checkpoint: Path | list[Path],
        *sets: str,
        args: tuple = (),
        program: tuple[str, ...] = ("-m", "mtx"),
    ) -> None:
        """`program`: what Python runs, `mtx serve ...` its arguments (a script that runs the
        CLI, for a test)."""
        paths = checkpoint if isinstance(checkpoint, list) else [checkpoint]
        cmd = [sys.executable, *program, "serve", "--port", "0", "--device", "cpu", *args]
        for path in paths:
            cmd += ["--checkpoint", str(path)]
        for item in sets:
            cmd += ["--set", item]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"mtx serve ended before listening: {''.join(self.lines)}")
            self.lines.append(line)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                break
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("mtx serve did not start in time")
        # keep reading what it prints, so that a full pipe never blocks the server
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        while self.get("/ready")[0] != 200:  # the socket listens before the worker starts
            if time.monotonic() > deadline:
                raise RuntimeError("mtx serve did not become ready in time")
            time.sleep(0.05)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def request(
        self, method: str, path: str, body: bytes | dict | None = None, timeout: float = 120
    ) -> tuple[int, dict, dict | str]:
        """(status, headers, JSON answer or text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            reply = conn.getresponse()
            raw = reply.read().decode("utf-8")
            kind = reply.getheader("Content-Type", "")
            answer = json.loads(raw) if kind.startswith("application/json") else raw
            return reply.status, dict(reply.getheaders()), answer
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, dict, dict | str]:
        try:
            return self.request("GET", path, timeout=10)
        except OSError:
            return 0, {}, ""

    def translate(self, texts, **options) -> tuple[int, dict | str]:
        status, _, answer = self.request("POST", "/translate", {"text": texts, **options})
        return status, answer

    def metric(self, name: str) -> float:
        """One sample of /metrics, e.g. `mtx_queue_depth` or `mtx_requests_total{outcome="ok"}`."""
        text = self.request("GET", "/metrics")[2]
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)

    def decoders(self) -> list[int]:
        """The pids of the server's decoding processes, sorted."""
        pids = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                if b"spawn_main" in cmdline:  # not multiprocessing's resource tracker
                    pids.append(int(child))
        return sorted(pids)

    def wait_for_queue(self, depth: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.metric("mtx_queue_depth") != depth:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the queue never held {depth} sentences")
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        """Send `sig` and return the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.reader.join(10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
