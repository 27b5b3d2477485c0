"""What a model can do beyond encode, decode and a growing cache (`Capabilities`), declared by
each kind of `Decodable` (interface.py). This module imports no torch: the engine table
(decode/engines.py) reads capabilities in the server's own process, which holds no model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a `Decodable` can do beyond encode, decode and a growing cache."""

    log_probs: bool = False  # decode() gives normalised log-probabilities, not logits
    mixed_lengths: bool = False  # encode() and decode() take a Groups of source lengths
    static_cache: bool = False  # new_static_cache() and fill_memory(): the static search
    candidates: bool = False  # continuations(): searches among its own candidates
    # output_weight(), output_bias() and states(): one pre-softmax projection (a shortlist's)
    output_matrix: bool = False
    attention: bool = False  # cross_attention_modules(): one attention to read (capture.py)
    ragged: bool = False  # new_ragged_cache(): rows at positions of their own (speculative)
