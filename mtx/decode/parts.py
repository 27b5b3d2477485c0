"""What a translator is made of (`Parts`): the model on its device, its settings, its codec and
its setup as the engine table sees it. The Translator holds one (translator.py); the scorer
(score.py) and the aligner (align.py) take the parts they read, never the translator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mtx.config import Config, DecodeConfig
from mtx.decode.codec import Codec
from mtx.decode.engines import Setup
from mtx.decode.languages import Languages
from mtx.model.decoder_self import decoder_self
from mtx.model.interface import Decodable


@dataclass(frozen=True)
class Parts:
    model: Decodable  # on `device`, in its decoding dtype, in eval mode (or as it was given)
    device: torch.device
    config: Config  # the first checkpoint's, with the settings given
    codec: Codec
    setup: Setup  # what the engine table reads (engines.py)
    checkpoints: tuple[Path, ...] = ()  # where the model came from (several: an ensemble)

    @property
    def batch_tokens(self) -> int:
        """The source-token budget of a batch (decode.batch_tokens)."""
        return self.config.decode.batch_tokens


def setup_of(model: Decodable, d: DecodeConfig, languages: Languages, device: str) -> Setup:
    """What the engine table reads of `model` decoded with settings `d` on `device`."""
    recurrent = any(decoder_self(m.cfg).recurrent for m in model.members())
    kind = dict(device=device, model=type(model).__name__, recurrent=recurrent)
    return Setup.of(d, model.capabilities, languages, **kind)
