"""Which search decodes a batch, as `decode.*` says, and the searches kept between batches.

- `decode.sampling`: ancestral sampling (search.py's greedy search drawing each token), each
  of a line's n samples from the seed (decode.seed, line number, sample number);
- `decode.search` static or graphs (auto on CUDA): the static search of static.py, one per
  decode settings, kept with its CUDA graphs from one batch to the next;
- otherwise the shrinking search of search.py: greedy search at beam 1, else beam search.

With `decode.shortlist`, the shrinking search and sampling decode the model through its
lexical shortlist (shortlist.py), loaded once and kept.

Every one of them follows the rules of rules.py.
"""

from __future__ import annotations

import torch

from mtx.config import DecodeConfig
from mtx.decode import rules
from mtx.decode.request import Request, SearchBatch
from mtx.decode.rules import Hypothesis
from mtx.decode.search import Sampling, beam_search, greedy_search
from mtx.decode.shortlist import Shortlist, Shortlisted
from mtx.decode.static import StaticSearch
from mtx.errors import MtxError
from mtx.model.interface import Decodable


class Searches:
    """The searches of one model on one device; `__call__` runs the one `decode.*` names."""

    def __init__(self, model: Decodable, device: torch.device, vocabulary: str = "") -> None:
        """`vocabulary`: the SentencePiece model's shortlist.vocabulary_sha256 (what a
        shortlist must have been built with)."""
        self.model, self.device, self.vocabulary = model, device, vocabulary
        self.kept: dict[tuple, StaticSearch] = {}  # see `static`
        self.shortlisted: dict[str, Shortlisted] = {}  # see `decoded`

    @property
    def limit(self) -> int:
        """The longest output the model takes, EOS included."""
        return self.model.max_positions - 1

    def __call__(self, batch: SearchBatch, d: DecodeConfig, nbest: int) -> list[list[Hypothesis]]:
        """The `nbest` hypotheses of each sentence of `batch` (batches.py), best first; with
        sampling, `nbest` samples of each, seeded by each request's line number."""
        if d.sampling:
            return self.sample(batch, d, nbest)
        static = self.static(d)
        if static is not None:
            return static(batch, nbest)
        a, b, limit, model = d.max_len_a, d.max_len_b, self.limit, self.decoded(d)
        if d.beam == 1:
            return [[h] for h in greedy_search(model, batch, a, b, limit)]
        return beam_search(model, batch, d.beam, d.alpha, a, b, limit, nbest, d.stopping)

    def decoded(self, d: DecodeConfig) -> Decodable:
        """What the shrinking search decodes: the model, or the model through the shortlist
        of `decode.shortlist` (loaded and checked the first time)."""
        if not d.shortlist:
            return self.model
        if d.shortlist not in self.shortlisted:
            if not self.model.capabilities.output_matrix:
                raise MtxError("decode.shortlist takes one model, not an ensemble")
            shortlist = Shortlist.load(d.shortlist)
            shortlist.check(self.vocabulary, self.model.vocab_size, d.shortlist)
            self.shortlisted[d.shortlist] = Shortlisted(self.model, shortlist)
        return self.shortlisted[d.shortlist]

    def sample(self, batch: SearchBatch, d: DecodeConfig, nbest: int) -> list[list[Hypothesis]]:
        """`nbest` samples of each sentence, the best first: sample j of the request of line i
        drawn from the seed (decode.seed, i, j)."""
        seeds = [[d.seed, r.line, j] for r in batch.requests for j in range(nbest)]
        requests: list[Request] = [r for r in batch.requests for _ in range(nbest)]
        repeated = SearchBatch(batch.src.repeat_interleave(nbest, 0), requests)
        sampling = Sampling(d.temperature, d.top_k, d.top_p)
        hyps = greedy_search(
            self.decoded(d), repeated, d.max_len_a, d.max_len_b, self.limit, sampling, seeds
        )
        return [rules.best(hyps[i : i + nbest], nbest) for i in range(0, len(hyps), nbest)]

    def static(self, d: DecodeConfig) -> StaticSearch | None:
        """The static search `decode.search` asks for (decode/static.py), or None for the
        shrinking one; one per decode settings, kept with its CUDA graphs."""
        mode = d.search
        if mode == "auto":
            mode = "graphs" if self.device.type == "cuda" else "shrinking"
        if mode == "shrinking":
            return None
        why = static_refusal(self.model, d, mode, self.device)
        if why:
            if d.search == "auto":
                return None
            raise MtxError(f"decode.search {mode}: {why}")
        key = (mode, d.beam, d.alpha, d.max_len_a, d.max_len_b, self.limit)
        if key not in self.kept:
            self.kept[key] = StaticSearch(
                self.model, d.beam, d.alpha, d.max_len_a, d.max_len_b, self.limit, mode == "graphs"
            )
        return self.kept[key]


def static_refusal(
    model: Decodable, d: DecodeConfig, mode: str, device: torch.device
) -> str | None:
    """Why the static search cannot run with these decode settings (None: it can)."""
    if mode == "graphs" and device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type}"
    if not model.capabilities.static_cache:
        return f"{type(model).__name__} has no static cache (the Transformer alone has one)"
    if d.sampling:
        return "sampling runs in the shrinking search only"
    if d.shortlist:
        return "decode.shortlist runs in the shrinking search only"
    if d.beam > 1 and d.stopping != "k_finished":
        return f"stopping {d.stopping} runs in the shrinking search only (static: k_finished)"
    return None
