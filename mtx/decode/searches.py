"""Which search decodes a batch, as `decode.*` says, and the searches kept between batches.

- `decode.sampling`: ancestral sampling (search.py's greedy search drawing each token), each
  of a line's n samples from the seed (decode.seed, line number, sample number);
- `decode.search` static or graphs (auto on CUDA): the static search of static.py, one per
  decode settings, kept with its CUDA graphs from one batch to the next;
- otherwise the shrinking search of search.py: greedy search at beam 1, else beam search.

Which of them decodes a request is dispatch.py's: requests with controls (a target prefix,
constraints, avoided phrases, alternatives: controls.py) are taken out of their batch and
decoded by the shrinking beam search under them, or the alternatives search (controlled.py),
the others as before: a sentence without controls is decoded as if the others were not there.

With `decode.shortlist`, the shrinking search and sampling decode the model through its
lexical shortlist (shortlist.py), loaded once and kept. With `decode.draft`, greedy search is
speculative (speculative.py): the draft model, loaded once and kept, proposes tokens the model
verifies several at a time.

Every one of them follows the rules of rules.py.
"""

from __future__ import annotations

import torch

from mtx.config import DecodeConfig
from mtx.decode import dispatch, rules
from mtx.decode.controlled import Alternatives, ConstrainedBeam, word_ends
from mtx.decode.languages import Languages
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis, SearchSettings
from mtx.decode.search import Sampling, beam_search, greedy_search
from mtx.decode.shortlist import Shortlist, Shortlisted
from mtx.decode.speculative import DraftStats, load_draft, speculative_search
from mtx.decode.speculative import refusal as draft_refusal
from mtx.decode.static import StaticSearch
from mtx.decode.tuning import DraftTuner
from mtx.errors import MtxError
from mtx.model.interface import Decodable


class Searches:
    """The searches of one model on one device; `__call__` runs the one `decode.*` names."""

    def __init__(
        self,
        model: Decodable,
        device: torch.device,
        vocabulary: str = "",
        vocab=None,
        languages: Languages | None = None,
    ) -> None:
        """`vocabulary`: the SentencePiece model's shortlist.vocabulary_sha256 (what a
        shortlist must have been built with); `vocab` the vocabulary (data/vocab.py), whose
        word ends constraints and prefixes follow (None: ids alone); `languages` its scheme
        (languages.py; None: one target language)."""
        self.model, self.device, self.vocabulary, self.vocab = model, device, vocabulary, vocab
        self.languages = languages
        self._ends: torch.Tensor | None = None  # controlled.word_ends, once needed
        self.kept: dict[tuple, StaticSearch] = {}  # see `static`
        self.shortlisted: dict[str, Shortlisted] = {}  # see `decoded`
        self.drafts: dict[tuple[str, str], Decodable] = {}  # see `drafter`
        self.draft_stats = DraftStats()  # what the drafts were worth, every batch's
        self.tuners: dict[tuple[str, str, int], DraftTuner] = {}  # decode.draft_adaptive's

    @property
    def limit(self) -> int:
        """The longest output the model takes, EOS included."""
        return self.model.max_positions - 1

    def __call__(self, batch: SearchBatch, d: DecodeConfig, nbest: int) -> list[list[Hypothesis]]:
        """The `nbest` hypotheses of each sentence of `batch` (batches.py), best first; with
        sampling, `nbest` samples of each, seeded by each request's line number. Each request
        is decoded by the search dispatch.py chooses for it, as if it were alone in the batch:
        requests with controls apart from the others, and those asking for N alternatives
        apart from those asking for another number."""
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(batch.requests):
            search = dispatch.check(r.controls, d, device=self.device.type)
            groups.setdefault((search, r.controls.alternatives), []).append(i)
        if len(groups) == 1:
            ((search, n),) = groups
            return self.run(search, n, batch, d, nbest)
        out: list[list[Hypothesis]] = [[] for _ in batch.requests]
        for (search, n), rows in groups.items():
            for i, hyps in zip(rows, self.run(search, n, batch.subset(rows), d, nbest)):
                out[i] = hyps
        return out

    def run(
        self, search: dispatch.Search, n: int, batch: SearchBatch, d: DecodeConfig, nbest: int
    ) -> list[list[Hypothesis]]:
        """`search` (dispatch.py) over a batch all of whose requests it decodes (`n`: the
        alternatives each asks for)."""
        if search in (dispatch.CONSTRAINED, dispatch.ALTERNATIVES):
            return self.controlled(batch, d, nbest, n)
        if search is dispatch.SPECULATIVE:
            return [[h] for h in self.speculative(batch, d)]
        return self.plain(batch, d, nbest)

    def speculative(self, batch: SearchBatch, d: DecodeConfig) -> list[Hypothesis]:
        """Greedy search's hypotheses, the draft of `decode.draft` proposing `draft_tokens`
        a call, or with `draft_adaptive` as many (none included) as have run fastest for
        batches of this size (tuning.py)."""
        settings, draft, stats = SearchSettings.of(d, self.limit), self.drafter(d), self.draft_stats

        def search(k: int) -> list[Hypothesis]:
            stats.batches[k] = stats.batches.get(k, 0) + 1
            if k == 0:
                return [hyps[0] for hyps in self.plain(batch, d, 1)]
            return speculative_search(self.model, draft, batch, settings, k, stats)

        if not d.draft_adaptive:
            return search(d.draft_tokens)
        key = (d.draft, d.dtype, d.draft_tokens)  # what the measurements are of
        if key not in self.tuners:
            self.tuners[key] = DraftTuner(d.draft_tokens)
        return self.tuners[key].run(len(batch.requests), search)

    def controlled(
        self, batch: SearchBatch, d: DecodeConfig, nbest: int, n: int
    ) -> list[list[Hypothesis]]:
        """The shrinking beam search under each request's controls (controlled.py); at beam 1
        without a length penalty, so that it is greedy search. With `n` alternatives asked
        for, greedy search, N rows a request (`Alternatives`), giving the N alternatives of
        each, best first."""
        if self.model.capabilities.candidates:
            raise MtxError("a target prefix or constraints run without a lexical shortlist")
        if self._ends is None and self.vocab is not None:
            self._ends = word_ends(self.vocab, self.device)
        if n == 0:
            steer = ConstrainedBeam(batch.requests, d.beam, self.device, self._ends)
            alpha = d.alpha if d.beam > 1 else 0.0
            settings = SearchSettings.of(d, self.limit, alpha=alpha)
            return beam_search(self.model, batch, settings, nbest, steer)
        pick = Alternatives(batch.requests, n, self.device, self._ends)
        settings = SearchSettings.of(d, self.limit)
        hyps = greedy_search(self.model, batch, settings, pick=pick, copies=n)
        return [hyps[i : i + n] for i in range(0, len(hyps), n)]

    def plain(self, batch: SearchBatch, d: DecodeConfig, nbest: int) -> list[list[Hypothesis]]:
        """`__call__` of requests without controls."""
        if d.sampling:
            return self.sample(batch, d, nbest)
        static = self.static(d)
        if static is not None:
            return static(batch, nbest)
        settings, model = SearchSettings.of(d, self.limit), self.decoded(d)
        if d.beam == 1:
            return [[h] for h in greedy_search(model, batch, settings)]
        return beam_search(model, batch, settings, nbest)

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

    def drafter(self, d: DecodeConfig) -> Decodable | None:
        """The draft model of `decode.draft` (speculative.py), loaded and checked the first
        time, or None; MtxError where the settings or the draft do not fit the model."""
        if not d.draft:
            return None
        why = draft_refusal(self.model, d)  # settings may change between calls
        if why:
            raise MtxError(f"decode.draft: {why}")
        key = (d.draft, d.dtype)
        if key not in self.drafts:
            pack = "int8" if d.dtype == "int8" else "fp32"
            draft = load_draft(d.draft, self.model, self.vocabulary, self.languages, pack)
            self.drafts[key] = draft
        return self.drafts[key]

    def sample(self, batch: SearchBatch, d: DecodeConfig, nbest: int) -> list[list[Hypothesis]]:
        """`nbest` samples of each sentence, the best first: sample j of the request of line i
        drawn from the seed (decode.seed, i, j)."""
        seeds = [[d.seed, r.line, j] for r in batch.requests for j in range(nbest)]
        sampling = Sampling(d.temperature, d.top_k, d.top_p)
        settings = SearchSettings.of(d, self.limit)
        hyps = greedy_search(self.decoded(d), batch, settings, sampling, seeds, copies=nbest)
        return [rules.best(hyps[i : i + nbest], nbest) for i in range(0, len(hyps), nbest)]

    def static(self, d: DecodeConfig) -> StaticSearch | None:
        """The static search `decode.search` asks for (decode/static.py), or None for the
        shrinking one; one per decode settings, kept with its CUDA graphs."""
        mode = dispatch.static_mode(d.search, self.device.type)
        if mode == "shrinking":
            return None
        why = static_refusal(self.model, d, mode, self.device)
        if self.languages is not None and self.languages.scheme == "codes":
            why = why or "an NLLB model's target-language start runs in the shrinking search only"
        if why:
            if d.search == "auto":
                return None
            raise MtxError(f"decode.search {mode}: {why}")
        settings = SearchSettings.of(d, self.limit, stopping="k_finished")
        key = (mode, settings)
        if key not in self.kept:
            self.kept[key] = StaticSearch(self.model, settings, mode == "graphs")
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
