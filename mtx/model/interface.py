"""What a search decodes: the `Decodable` interface, declared once.

Every search (decode/search.py, decode/static.py), the Translator, the scorer and the server
decode a `Decodable` and read what it can do from its `capabilities`, never by probing it for
methods (tests/test_architecture.py finds any `hasattr`/`getattr` of these names). Four kinds
implement it: the Transformer (model/transformer.py), the RNN (model/rnn.py), an ensemble of
either (decode/ensemble.py) and a model seen through its lexical shortlist
(decode/shortlist.py).

Shape legend: N hypothesis rows, S source length, T decoder inputs, V vocabulary, d width.

- `encode(src)`: (B, S) source ids -> (memory, source mask), one row per sentence; a model
  whose `capabilities.mixed_lengths` also takes a `Groups` of sources (model/groups.py).
- `new_cache()`: what incremental decoding keeps between steps (model/cache.py), one row per
  hypothesis for what it has decoded, one per sentence for what comes from the encoder.
- `decode(tgt_in, memory, src_mask, cache)`: (N, T) inputs -> (N, T, V) logits, or
  log-probabilities where `capabilities.log_probs`; with a cache, only the new positions.
- `new_static_cache(...)`, `fill_memory(...)`: a cache allocated once and written in place,
  what the static search replays (`capabilities.static_cache`).
- `new_ragged_cache(capacity)`: a cache whose rows stand at positions of their own, what
  speculative decoding verifies and drafts with (model/ragged.py; `capabilities.ragged`).
- `continuations(...)`: the best 2K continuations of each sentence's K beams found among the
  model's own candidates (`capabilities.candidates`: a lexical shortlist).
- `output_weight()`, `output_bias()`, `states(tgt_in, memory, src_mask, cache)`: the (V, d)
  pre-softmax projection a shortlist takes, its (V,) bias or None, and the (N, T, d) states
  it projects (`decode` is their product; `capabilities.output_matrix`: one model, not an
  ensemble).
- `cross_attention_modules()`: the encoder-decoder attention of each decoder layer, which
  model/capture.py reads from beside the model (`capabilities.attention`);
  `full_context(tgt_in, memory, src_mask, layers)`: the first decoder layers over the whole
  target without the causal mask, the pass whose attention a guided model aligns in (the
  Transformer with an attention self-sublayer; any other refuses).
- `members()`: the single models it decodes with, in order (itself, or an ensemble's).
- `specials`: the token its decoder starts from and the ids it never outputs (mtx/tokens.py).

A capability a kind lacks is a method that refuses in one line (`Lacks`), so that a caller who
did not read the capability gets an error naming the model, not an AttributeError.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from mtx.errors import MtxError
from mtx.model.capabilities import Capabilities
from mtx.tokens import Specials


@runtime_checkable
class Decodable(Protocol):
    """The model interface of every search; see the module's docstring."""

    capabilities: Capabilities
    vocab_size: int

    @property
    def max_positions(self) -> int:
        """The longest sequence (source, or output with BOS) the model takes."""
        ...

    @property
    def specials(self) -> Specials: ...

    def members(self) -> list[Any]: ...

    def encode(self, src: Any) -> tuple[Any, Any]: ...

    def decode(self, tgt_in: Tensor, memory: Any, src_mask: Any, cache: Any = None) -> Tensor: ...

    def new_cache(self) -> Any: ...

    def new_static_cache(self, rows: int, length: int, full: bool, like: Tensor) -> Any: ...

    def new_ragged_cache(self, capacity: int) -> Any: ...

    def fill_memory(self, cache: Any, memory: Tensor) -> None: ...

    def continuations(
        self, last: Tensor, memory: Any, src_mask: Any, cache: Any, force_eos: list[bool],
        scores: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]: ...  # fmt: skip

    def output_weight(self) -> Tensor: ...

    def output_bias(self) -> Tensor | None: ...

    def states(self, tgt_in: Tensor, memory: Any, src_mask: Any, cache: Any = None) -> Tensor: ...

    def cross_attention_modules(self) -> list[Any]: ...

    def full_context(self, tgt_in: Tensor, memory: Any, src_mask: Any, layers: int) -> Tensor: ...


class Lacks:
    """The methods of the capabilities a kind lacks, each refusing in one line. A class
    lists this after the classes that implement what it has."""

    def _lacks(self, what: str) -> MtxError:
        return MtxError(f"{type(self).__name__} has no {what}")

    def new_static_cache(self, rows: int, length: int, full: bool, like: Tensor) -> Any:
        raise self._lacks("static cache (the static search decodes the Transformer alone)")

    def fill_memory(self, cache: Any, memory: Tensor) -> None:
        raise self._lacks("static cache (the static search decodes the Transformer alone)")

    def new_ragged_cache(self, capacity: int) -> Any:
        raise self._lacks("cache of rows at positions of their own (a Transformer has)")

    def continuations(
        self, last: Tensor, memory: Any, src_mask: Any, cache: Any, force_eos: list[bool],
        scores: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        raise self._lacks("candidates of its own (a lexical shortlist has)")

    def output_weight(self) -> Tensor:
        raise self._lacks("single output matrix")

    def output_bias(self) -> Tensor | None:
        raise self._lacks("single output matrix")

    def states(self, tgt_in: Tensor, memory: Any, src_mask: Any, cache: Any = None) -> Tensor:
        raise self._lacks("single output matrix")

    def cross_attention_modules(self) -> list[Any]:
        raise self._lacks("single attention to read")

    def full_context(self, tgt_in: Tensor, memory: Any, src_mask: Any, layers: int) -> Tensor:
        raise self._lacks("full-context pass (align in context causal)")
