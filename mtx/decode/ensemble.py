"""Several models decoding as one: `mtx translate --checkpoint A --checkpoint B ...`.

At every step the ensemble's next-token distribution is the mean of the models' probabilities,
p(y | x, prefix) = (1/M) sum_m p_m(y | x, prefix), as fairseq's ensembles do (the mean of
probabilities, not of log-probabilities: a token that one model rules out keeps the others'
mass). `decode` returns its log, computed as r + log(mean_m exp(log p_m - r)) with r the
largest log p_m: M copies of one model then give exactly that model's log-probabilities, and
the search (told by `capabilities.log_probs`) uses them as they are.

An `Ensemble` is a `Decodable` (model/interface.py), as one model is: `encode` gives each
model's memory and mask, `new_cache` an `EnsembleCache` that holds every model's own cache
(reordering it reorders them all), `decode` runs each model on its own. Each model computes a
sentence alone (batch-independent), and the mean is taken per row, so an ensemble is as
independent of the batch as one model. The models may differ in architecture (a Transformer
with the RNN); they must share the vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.model.base import EncoderDecoder
from mtx.model.interface import Capabilities, Lacks


class Masks:
    """Each model's source mask (or None), selected by rows together, as the search does with
    one model's mask."""

    def __init__(self, masks: list[Tensor | None]) -> None:
        self.masks = masks

    def __getitem__(self, index) -> Masks:
        return Masks([None if m is None else m[index] for m in self.masks])


class EnsembleCache:
    """Each model's cache (model/cache.py), reordered and selected together."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def reorder(self, rows: Tensor) -> None:
        for part in self.parts:
            part.reorder(rows)

    def select(self, sentences: Tensor) -> None:
        for part in self.parts:
            part.select(sentences)


class Ensemble(Lacks):
    def __init__(self, models: list[EncoderDecoder]) -> None:
        if len(models) < 2:
            raise ValueError("an ensemble takes at least two models")
        vocab = {m.vocab_size for m in models}
        if len(vocab) != 1:
            raise ValueError(f"the models' vocabulary sizes differ: {sorted(vocab)}")
        specials = {m.specials for m in models}
        if len(specials) != 1:
            raise ValueError("the models' decoders start from different tokens")
        self.models = models
        self.vocab_size, self.specials = models[0].vocab_size, models[0].specials
        # decode() gives normalised log-probabilities; sources of several lengths in one batch
        # (model/groups.py) if every model takes them
        mixed = all(m.capabilities.mixed_lengths for m in models)
        self.capabilities = Capabilities(log_probs=True, mixed_lengths=mixed)

    @property
    def max_positions(self) -> int:
        """The longest sequence every model takes."""
        return min(m.max_positions for m in self.models)

    def members(self) -> list[EncoderDecoder]:
        return list(self.models)

    def to(self, *args, **kwargs) -> Ensemble:
        self.models = [m.to(*args, **kwargs) for m in self.models]
        return self

    def eval(self) -> Ensemble:
        for m in self.models:
            m.eval()
        return self

    def pack(self, kind: str | None) -> bool:
        return all([m.pack(kind) for m in self.models])

    def encode(self, src: Tensor) -> tuple[list[Tensor], Masks]:
        out = [m.encode(src) for m in self.models]
        return [memory for memory, _ in out], Masks([mask for _, mask in out])

    def new_cache(self) -> EnsembleCache:
        return EnsembleCache([m.new_cache() for m in self.models])

    def decode(
        self,
        tgt_in: Tensor,
        memory: list[Tensor] | None,
        masks: Masks,
        cache: EnsembleCache | None = None,
    ) -> Tensor:
        """(N, T) decoder inputs -> (N, T, V) log of the mean of the models' probabilities
        (without `cache`: the whole of `tgt_in` at once, as in scoring)."""
        lprobs = []
        parts = [None] * len(self.models) if cache is None else cache.parts
        for i, (m, part) in enumerate(zip(self.models, parts)):
            logits = m.decode(tgt_in, None if memory is None else memory[i], masks.masks[i], part)
            lprobs.append(torch.log_softmax(logits.float(), dim=-1))
        stacked = torch.stack(lprobs)  # (M, N, T, V)
        r = stacked.max(dim=0).values
        r = r.masked_fill(r == -torch.inf, 0.0)  # no model allows the token: stays -inf
        return r + torch.log(torch.exp(stacked - r).mean(dim=0))
