"""What the engines (engines.py) run with: one `Runtime` per translator, holding what is
loaded once and kept between batches.

- the model seen through its lexical shortlist (`decode.shortlist`: shortlist.py), loaded and
  checked when the runtime is made, not mid-input;
- the draft model of `decode.draft` (speculative.py), loaded and checked then too, and the
  tuners of `decode.draft_adaptive` (tuning.py), one per batch-size bucket's measurements;
- the static searches (static.py), one per search settings, kept with their CUDA graphs;
- the CTranslate2 model of `decode.engine: ctranslate2` (ct2.py), loaded on first use;
- what the drafts were worth (`stats`), counted here for every batch.

`__call__` decodes a batch: each request by the engine `engines.choose` picks for it, as if
it were alone in the batch (requests with controls apart from the others, those asking for N
alternatives apart from those asking for another number). Every engine follows the rules of
rules.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mtx.config import DecodeConfig
from mtx.decode import engines
from mtx.decode.codec import Codec
from mtx.decode.controlled import word_ends
from mtx.decode.options import Options
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis, SearchSettings
from mtx.decode.shortlist import Shortlist, Shortlisted
from mtx.decode.speculative import DraftStats, load_draft, speculative_search
from mtx.decode.static import StaticSearch
from mtx.decode.tuning import DraftTuner
from mtx.errors import MtxError
from mtx.model.interface import Decodable


class Runtime:
    def __init__(
        self,
        model: Decodable,
        device: torch.device,
        settings: DecodeConfig,
        codec: Codec | None,
        setup: engines.Setup,
        vocabulary: str = "",
        checkpoints: tuple[Path, ...] = (),
    ) -> None:
        """`settings`: the translator's decode.* (fixed for its life); `codec`: its text and ids
        (None: ids alone, as the engines' unit tests decode); `vocabulary`: the SentencePiece
        model's shortlist.vocabulary_sha256 (what a shortlist and a draft must
        share); `checkpoints`: where the model came from (a CTranslate2 export beside it)."""
        self.model, self.device, self.d, self.codec = model, device, settings, codec
        self.setup, self.vocabulary, self.checkpoints = setup, vocabulary, checkpoints
        if setup.engine != "auto":
            engines.named(setup.engine)  # a known name, or one line
        self._decoded = self._shortlisted() if settings.shortlist else model
        self.draft = self._draft() if settings.draft else None
        self._ends: torch.Tensor | None = None  # controlled.word_ends, once needed
        self.kept: dict[tuple, StaticSearch] = {}  # see `static`
        self.tuner: DraftTuner | None = None  # decode.draft_adaptive's, once needed
        self.stats = DraftStats()  # what the drafts were worth, every batch's
        self.ct2_model, self.ct2_threads = None, 0  # ct2.py's

    @property
    def limit(self) -> int:
        """The longest output the model takes, EOS included."""
        return self.model.max_positions - 1

    def __call__(self, batch: SearchBatch, options: Options) -> list[list[Hypothesis]]:
        """The hypotheses of each request of `batch` (`options.nbest` of each, best first),
        each by the engine chosen for it, as if it were alone in the batch."""
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(batch.requests):
            engine = engines.choose(r.controls, options, self.setup)
            groups.setdefault((engine.name, r.controls.alternatives), []).append(i)
        if len(groups) == 1:
            ((name, _),) = groups
            return engines.ENGINES[name].run(self, batch, options)
        out: list[list[Hypothesis]] = [[] for _ in batch.requests]
        for (name, _), rows in groups.items():
            for i, hyps in zip(rows, engines.ENGINES[name].run(self, batch.subset(rows), options)):
                out[i] = hyps
        return out

    def settings(self, o: Options, **changes) -> SearchSettings:
        """What a search is told for options `o` (rules.py)."""
        return SearchSettings.of(o, self.limit, **changes)

    def decoded(self) -> Decodable:
        """What the shrinking search decodes: the model, or the model through its shortlist."""
        return self._decoded

    def word_ends(self) -> torch.Tensor | None:
        """controlled.word_ends of the vocabulary, computed once (None without a codec: ids
        alone)."""
        if self._ends is None and self.codec is not None:
            self._ends = word_ends(self.codec.vocab, self.device)
        return self._ends

    def static(self, o: Options, graphs: bool) -> StaticSearch:
        """The static search of options `o` (static.py), one per settings, kept with its
        CUDA graphs."""
        settings = self.settings(o, stopping="k_finished")
        key = (graphs, settings)
        if key not in self.kept:
            self.kept[key] = StaticSearch(self.model, settings, graphs)
        return self.kept[key]

    def speculative(self, batch: SearchBatch, o: Options) -> list[Hypothesis]:
        """Greedy search's hypotheses, the draft proposing `draft_tokens` a call, or with
        `draft_adaptive` as many (none included) as have run fastest for batches of this size
        (tuning.py); every batch counted in `stats` by its draft length."""
        settings, d = self.settings(o), self.d

        def search(k: int) -> list[Hypothesis]:
            self.stats.batch(k)
            if k == 0:
                return [hyps[0] for hyps in engines.ENGINES["greedy"].run(self, batch, o)]
            return speculative_search(self.model, self.draft, batch, settings, k, self.stats)

        if not d.draft_adaptive:
            return search(d.draft_tokens)
        if self.tuner is None:
            self.tuner = DraftTuner(d.draft_tokens)
        return self.tuner.run(len(batch.requests), search)

    def _shortlisted(self) -> Shortlisted:
        if not self.model.capabilities.output_matrix:
            raise MtxError("decode.shortlist takes one model, not an ensemble")
        shortlist = Shortlist.load(self.d.shortlist)
        shortlist.check(self.vocabulary, self.model.vocab_size, self.d.shortlist)
        return Shortlisted(self.model, shortlist)

    def _draft(self) -> Decodable:
        pack = "int8" if self.d.dtype == "int8" else "fp32"
        languages = self.codec.languages
        return load_draft(self.d.draft, self.model, self.vocabulary, languages, pack)
