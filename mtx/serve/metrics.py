"""`GET /metrics`: the service's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# what became of a request or a sentence
OUTCOMES = ("ok", "invalid", "too_large", "queue_full", "timeout", "unavailable", "error")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mtx_requests", "POST /translate requests by outcome", ["outcome"], registry=r
        )
        self.sentences = Counter(
            "mtx_sentences", "Texts of POST /translate requests by outcome", ["outcome"], registry=r
        )
        self.tokens_in = Counter("mtx_tokens_in", "Source subwords translated", registry=r)
        self.tokens_out = Counter(
            "mtx_tokens_out", "Output subwords (best translation)", registry=r
        )
        self.queue = Gauge("mtx_queue_depth", "Sentences waiting for a batch", registry=r)
        self.workers = Gauge("mtx_workers", "Decoding workers (serve.workers)", registry=r)
        self.busy = Gauge("mtx_workers_busy", "Decoding workers decoding a batch now", registry=r)
        self.batch = Histogram(
            "mtx_batch_sentences",
            "Sentences per decoded batch",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.latency = Histogram(
            "mtx_request_seconds",
            "POST /translate latency, answered requests",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        for outcome in OUTCOMES:  # every series exists from the start, at 0
            self.requests.labels(outcome)
            self.sentences.labels(outcome)

    def count(self, outcome: str, sentences: int) -> None:
        self.requests.labels(outcome).inc()
        self.sentences.labels(outcome).inc(sentences)
