"""Adaptive speculative decoding (`decode.draft_adaptive`): for each batch size, the search
measures greedy search without drafts and with drafts of a few lengths, and decodes each batch
the way that has run fastest.

Whether drafts pay depends on the host, the pair of models and the batch: a verifying call
costs more than a step of the model, the draft's steps cost what they cost, and the rows of a
batch wait for its slowest (docs/decoding.md, "When it pays"; BENCHMARKS.md, "Speculative
decoding": the Multi30k pair on two CPU cores ran at 0.84x greedy search's speed at batch 1,
drafting 2 tokens a call, and at 0.54x at batch 32). Rather than a rule of thumb, the tuner
times what it runs: per batch size (1, 2-4, 5-16, 17-64, ...: `bucket`), each way (k = 0,
plain greedy search, then k = 1, 2, 4, ... up to `decode.draft_tokens`) is tried `explore`
times, in that order; then every batch runs the way with the best output rate (tokens, EOS
included, a second, over its last `window` runs), and every `revisit`-th batch of a size the
way measured least recently, so that the estimates follow the host's load. A job of few
batches pays for the exploration (BENCHMARKS.md, "Speculative decoding"); a long job or a
server soon decodes every batch the fastest way.

The output never depends on the choice: every way gives greedy search's hypotheses exactly
(speculative.py), so the clock decides how fast a batch is decoded, never what it becomes
(which is also why processes of a torchrun job may choose differently). The runtime counts
the batches each way decoded (`DraftStats.batch`, runtime.py), whichever way chose it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from mtx.decode.rules import Hypothesis


def ways(k_max: int) -> list[int]:
    """The draft lengths tried: 0 (no drafts), the powers of two below `k_max`, and `k_max`."""
    return [0] + sorted({2**i for i in range(k_max.bit_length()) if 2**i < k_max} | {k_max})


def bucket(sentences: int) -> int:
    """The batch sizes measured together: 1, 2-4, 5-16, 17-64, ... (0, 1, 2, 3, ...)."""
    return ((sentences - 1).bit_length() + 1) // 2


class DraftTuner:
    """See the module's docstring; `clock` is injected by tests."""

    def __init__(
        self,
        k_max: int,
        explore: int = 1,
        window: int = 8,
        revisit: int = 32,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.ways, self.explore, self.window, self.revisit = ways(k_max), explore, window, revisit
        self.clock = clock
        self.rates: dict[tuple[int, int], deque[float]] = {}  # (bucket, k) -> tokens/s
        self.batches: dict[int, int] = {}  # bucket -> batches decoded
        self.measured: dict[tuple[int, int], int] = {}  # (bucket, k) -> batch number, last run

    def choose(self, sentences: int) -> int:
        """The draft length (0: none) of the next batch of `sentences` (a query: `run`
        records what ran)."""
        b = bucket(sentences)
        n = self.batches.get(b, 0) + 1  # the number of the batch to come
        for k in self.ways:
            if len(self.rates.get((b, k), ())) < self.explore:
                return k
        best = max(self.ways, key=lambda k: self.rate(b, k))
        if n % self.revisit == 0:
            others = [k for k in self.ways if k != best]
            return min(others, key=lambda k: self.measured[(b, k)])
        return best

    def rate(self, b: int, k: int) -> float:
        """Tokens a second of way `k` at batch sizes `b`, over its last `window` runs."""
        runs = self.rates[(b, k)]
        return sum(runs) / len(runs)

    def run(self, sentences: int, search: Callable[[int], list[Hypothesis]]) -> list[Hypothesis]:
        """`search(k)` for the `k` chosen for a batch of `sentences`, timed and recorded."""
        k = self.choose(sentences)
        start = self.clock()
        hyps = search(k)
        seconds = max(self.clock() - start, 1e-9)
        b = bucket(sentences)
        self.batches[b] = self.batches.get(b, 0) + 1
        tokens = sum(len(h.tokens) + 1 for h in hyps)
        self.rates.setdefault((b, k), deque(maxlen=self.window)).append(tokens / seconds)
        self.measured[(b, k)] = self.batches[b]
        return hyps
