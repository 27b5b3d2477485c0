"""What tests ask of a Translator (mtx/decode/translator.py) most often, through its doors."""

from __future__ import annotations

from mtx.decode.translator import Translator


def load(path, *sets: str, device: str = "cpu", **decode) -> Translator:
    """The translator of checkpoint(s) `path` with --set `sets` and decode.* `decode`."""
    return Translator.from_checkpoints(path, list(sets), device=device, decode=decode or None)


def outputs(tr: Translator, items, first: int = 0, **options) -> list[tuple]:
    """Each item's outputs (result.py's Output: text, score, log_prob, unmet, links, tokens),
    best first, under the translator's options but for `options`."""
    return [t.outputs for t in tr.translate(list(items), tr.options(**options), first)]


def texts(tr: Translator, items, **options) -> list[str]:
    """Each item's best translation."""
    return [t.best.text for t in tr.translate(list(items), tr.options(**options))]


def tokens(tr: Translator, items, **options) -> list[list[int]]:
    """Each item's best output ids."""
    return [list(t.best.tokens) for t in tr.translate(list(items), tr.options(**options))]


def encode(tr: Translator, line: str, tgt_lang: str | None = None) -> list[int]:
    return tr.parts.codec.encode(line, tgt_lang)


class Engines:
    """The engines (mtx/decode/engines.py) over a model without a vocabulary, as unit tests
    call them: `engines(batch, decode settings, nbest)` -> each request's hypotheses, each
    decoded by the engine the table chooses for it (a runtime of those settings)."""

    def __init__(self, model, device) -> None:
        self.model, self.device = model, device

    def __call__(self, batch, d, nbest: int = 1) -> list:
        from mtx.decode.languages import Languages
        from mtx.decode.options import Options
        from mtx.decode.parts import setup_of
        from mtx.decode.runtime import Runtime

        one = Languages("one", {}, ("de",), "en", "de")
        setup = setup_of(self.model, d, one, self.device.type)
        runtime = Runtime(self.model, self.device, d, None, setup)
        return runtime(batch, Options.of(d, nbest=nbest))
