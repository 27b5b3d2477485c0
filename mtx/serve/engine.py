"""What `mtx serve` decodes with: a Translator (decode/translator.py), in a decoding process.

`ServeEngine.translate` is the translator's `translate` over a batch of texts under one
request's options: the same engines, settings and batch independence as `mtx translate`, so a
sentence gets the translation that `mtx translate` gives it, whatever else is in its batch.
Which engine decodes is decode/engines.py's: mtx's own searches (`--engine mtx`, the default:
decode.engine auto), or a CTranslate2 export of the checkpoint (`--engine ctranslate2`, made
here on first use: decode/ct2.py; faster on the CPU, but not exact). Each engine lives in a
decoding process of its own (workers.py), fed by one batcher worker (batcher.py) one batch at
a time, so it needs no locking. `describe_engine` tells the server's own process, which holds
no model, what it needs to know of it (front.py).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from mtx.decode.controls import Line
from mtx.decode.ct2 import export_dir
from mtx.decode.options import Options
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.serve.front import About, Result, check_engine


class ServeEngine:
    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    def set_threads(self, n: int) -> None:
        torch.set_num_threads(n)

    def translate(self, texts: list[str | Line], options: Options) -> list[Result]:
        """Each text's result, in order; its attention (as JSON) where `options` asks."""
        out = []
        for translation in self.translator.translate(texts, options):
            attention = translation.attention
            if attention is not None:  # no tensor crosses to the server's process
                translation = dataclasses.replace(translation, attention=None)
            out.append(
                Result(translation, list(translation.best.tokens),
                       attention=None if attention is None else attention.to_json())
            )  # fmt: skip
        return out


def make_engine(
    name: str, checkpoints: list[Path], overrides: list[str], device: str, ct2_dir: Path | None
) -> ServeEngine:
    """The translator `mtx serve --engine NAME` decodes with (a CTranslate2 export made first
    where asked: made on first use into `ct2_dir`, or CKPT.ct2 beside the checkpoint; made
    again there when the checkpoint has changed)."""
    check_engine(name)
    if name == "ctranslate2":
        from mtx.formats import ct2_export_of

        os.environ.setdefault("CT2_VERBOSE", "-1")
        overrides = [*overrides, "decode.engine=ctranslate2"]
        if ct2_dir is not None:
            overrides.append(f"decode.ct2_dir={ct2_dir}")
        if len(checkpoints) == 1:  # an ensemble is refused by the engine table
            ct2_export_of(checkpoints[0], export_dir(checkpoints[0], str(ct2_dir or "")),
                          owned=ct2_dir is None)  # fmt: skip
    translator = Translator.from_checkpoints(checkpoints, overrides, device)
    if translator.parts.config.decode.sampling:
        raise MtxError("mtx serve runs the search: set decode.sampling=false")
    languages = translator.parts.codec.languages  # a request names its language
    translator.options(tgt_lang=languages.targets[0] if languages.needs_target else None)
    return ServeEngine(translator)


def describe_engine(engine: ServeEngine, checkpoints: list[Path], overrides: list[str]) -> About:
    """What the server's own process needs to know of `engine` (front.py)."""
    from mtx.info import describe
    from mtx.model.transformer import count_parameters

    parts = engine.translator.parts
    models = parts.model.members()  # an Ensemble's, in --checkpoint order
    return About(
        cfg=parts.config,
        spm_proto=parts.codec.vocab.blob,
        max_positions=parts.model.max_positions,  # what the codec cuts sources to
        setup=parts.setup,
        checkpoints=[
            describe(str(path), overrides, parameters=count_parameters(model)).to_json()
            for path, model in zip(checkpoints, models)
        ],
    )
