"""Every way mtx decodes, one table (`ENGINES`): each engine registered once with the controls
it takes, what it needs of the model (model/capabilities.py), what it refuses, what its
outputs can carry, when `decode.engine: auto` chooses it, and how it runs.

    name          what runs                                       auto chooses it for
    drafts        greedy search verifying a draft's proposals     a draft model (decode.draft),
                  (speculative.py, tuning.py)                     beam 1, no controls
    static        the static search (static.py)                   decode.search static
    graphs        the static search, each step a CUDA graph       decode.search graphs, or auto
                                                                  on CUDA where it can run
    sampling      ancestral sampling, seeded per line             decode.sampling
    alternatives  N alternatives at the first word                a sentence asking for them
                  (controlled.py)
    constrained   beam search under a prefix, constraints or      a sentence with any other
                  phrases to avoid (controlled.py)                control
    greedy        greedy search (search.py)                       beam 1
    beam          beam search (search.py)                         the rest
    ctranslate2   a CTranslate2 export of the model (ct2.py)      never (by name only)

`choose` picks the engine of one sentence: the one `decode.engine` names, or under `auto` the
first of the table whose rule holds for the sentence's controls and the request's options.
`check` gives that engine, or refuses in one line what it cannot do: a control it does not
take, a capability the model lacks, an option it cannot honour, and what a request asks of
every engine's output (a target language the model has, alignments and attention from one
model's attention, the marks of a format put back by the word alignment). The Translator
(translator.py) checks each request at its door, the server's own process each request before
it is queued (serve/front.py, from the `Setup` its first decoding process describes), and the
runtime (runtime.py) runs what `choose` picks; nothing else decides which engine decodes.

An ensemble is no engine of its own: it is a model (ensemble.py) without one attention, a
static cache or rows at positions of their own, so the engines that need those refuse it.

This module imports no torch: the server's own process reads the table. An engine's `run`
imports what it runs when it runs. Adding an engine is one `register(Engine(...))`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mtx.config import DecodeConfig
from mtx.config.decode import SearchMode
from mtx.decode.controls import Controls, Segmented, segment
from mtx.decode.languages import Languages
from mtx.decode.options import Options
from mtx.errors import MtxError
from mtx.model.capabilities import Capabilities

# what an engine's outputs may carry beyond the hypotheses (`Engine.gives`)
ALIGNMENTS, ATTENTION = "alignments", "attention"

Run = Callable[[Any, Any, Options], list]  # (runtime.py's Runtime, SearchBatch, options)


@dataclass(frozen=True)
class Setup:
    """A translator as the table sees it: what its model can do and what its settings chose
    (no torch: the server's own process holds one, described by its first decoding process)."""

    capabilities: Capabilities  # the model's own (a shortlist it is decoded through: shortlist)
    languages: Languages  # the model's language scheme (languages.py)
    device: str = "cpu"  # "cpu" or "cuda"
    model: str = "Transformer"  # the model's kind, as a refusal names it
    recurrent: bool = False  # a decoder whose self-sublayer is a recurrence (an SSRU)
    engine: str = "auto"  # decode.engine
    search: SearchMode = "auto"  # decode.search
    draft: bool = False  # a draft model (decode.draft)
    shortlist: bool = False  # decode.shortlist
    placeholders: bool = True  # decode.placeholders names some (a format's marks)

    @classmethod
    def of(cls, d: DecodeConfig, capabilities: Capabilities, languages: Languages, **model):
        """The setup of a translator with decode settings `d`; `model`: device, model,
        recurrent."""
        return cls(
            capabilities, languages, engine=d.engine, search=d.search, draft=bool(d.draft),
            shortlist=bool(d.shortlist), placeholders=bool(d.placeholders), **model,
        )  # fmt: skip


@dataclass(frozen=True)
class Ask:
    """What one sentence asks: its controls, its request's options, of a translator's setup."""

    controls: Controls
    options: Options
    setup: Setup


def _never(ask: Ask) -> bool:
    return False


def _nothing(ask: Ask) -> str:
    return ""


@dataclass(frozen=True)
class Engine:
    """One way to decode (the module's docstring)."""

    name: str  # decode.engine's word for it
    title: str  # as a refusal names it
    run: Run  # (runtime, batch, options) -> each request's hypotheses, best first
    takes: frozenset[str] = frozenset()  # the controls it honours (controls.py)
    needs: tuple[str, ...] = ()  # the model's capabilities it needs (capabilities.py)
    refuses: Callable[[Ask], str] = _nothing  # why it cannot do what is asked ("" if it can)
    auto: Callable[[Ask], bool] = _never  # whether decode.engine auto chooses it
    gives: frozenset[str] = frozenset({ALIGNMENTS, ATTENTION})  # what its outputs can carry
    mixed: bool = True  # takes batches of several padded source lengths (model/groups.py)
    plural: bool = False  # its title is a plural ("alternatives take no ...")

    def supports(self, ask: Ask) -> str:
        """Why it cannot decode what `ask` asks ("" if it can)."""
        left = [name for name in ask.controls if name not in self.takes]
        if left:
            return f"{self.title} {'take' if self.plural else 'takes'} no {left[0]}"
        for need in self.needs:
            if not getattr(ask.setup.capabilities, need):
                return f"{self.title}: {ask.setup.model} has no {NEEDS[need]}"
        why = self.refuses(ask)
        return f"{self.title}: {why}" if why else ""


NEEDS = {  # each capability, as a refusal names it
    "static_cache": "static cache (the Transformer alone has one)",
    "ragged": "cache of rows at positions of their own (one Transformer has)",
    "attention": "attention of one model",
    "output_matrix": "single output matrix (one checkpoint, not an ensemble)",
}

ENGINES: dict[str, Engine] = {}  # by name, in the order `auto` tries them


def register(engine: Engine, before: str | None = None) -> Engine:
    """Add `engine` to the table (before the engine named `before`, else last)."""
    if engine.name in ENGINES or engine.name == "auto":
        raise ValueError(f"an engine named {engine.name!r} is registered already")
    items = list(ENGINES.items())
    at = len(items) if before is None else [k for k, _ in items].index(before)
    items.insert(at, (engine.name, engine))
    ENGINES.clear()
    ENGINES.update(items)
    return engine


def named(name: str) -> Engine:
    """The engine `name` (decode.engine), or MtxError listing them."""
    if name not in ENGINES:
        raise MtxError(f"decode.engine: no engine named {name!r} (auto, {', '.join(ENGINES)})")
    return ENGINES[name]


def choose(controls: Controls, options: Options, setup: Setup) -> Engine:
    """The engine that decodes a sentence with `controls`: decode.engine's, or under auto
    the first of the table whose rule holds."""
    if setup.engine != "auto":
        return named(setup.engine)
    ask = Ask(controls, options, setup)
    return next(engine for engine in ENGINES.values() if engine.auto(ask))


def check(controls: Controls, options: Options, setup: Setup, where: str = "") -> Engine:
    """The engine `choose` picks, or MtxError (naming `where`) for what it cannot do."""
    engine = choose(controls, options, setup)
    ask = Ask(controls, options, setup)
    why = engine.supports(ask) or asked_of_outputs(ask, engine)
    if why:
        raise MtxError(f"{where}: {why}" if where else why)
    return engine


def check_line(
    controls: Controls, options: Options, setup: Setup, target: Callable[[str], list[int]],
    never_below: int, longest: int, where: str = "",
) -> Segmented:  # fmt: skip
    """A sentence's controls checked as every door checks them (the Translator's, the
    server's own process): the engine chosen for them takes them (`check`), and they can be
    honoured in the sentence's `longest` output (controls.segment: `target` segments a target
    text, ids below `never_below` are never produced); segmented into target ids. MtxError
    naming `where`."""
    check(controls, options, setup, where)
    try:
        return segment(controls, target, never_below, longest)
    except MtxError as e:
        raise MtxError(f"{where}: {e}" if where else str(e)) from None


def asked_of_outputs(ask: Ask, engine: Engine) -> str:
    """Why a request's options cannot be given whatever decodes it ("" if they can): its
    target language, alignments and attention (one model's attention, an engine that gives
    them), and a format's needs (one translation a text, its marks put back by alignment)."""
    o, setup = ask.options, ask.setup
    why = setup.languages.refusal(o.tgt_lang) or format_refusal(o, setup, engine)
    for asked, what in ((o.alignments, ALIGNMENTS), (o.attention, ATTENTION)):
        if why or not asked:
            continue
        if what not in engine.gives:
            why = f"{engine.title} gives no {what}"
        elif not setup.capabilities.attention:
            why = f"decode.{what} reads one model's attention: give one checkpoint, not an ensemble"
    return why


def format_refusal(o: Options, setup: Setup, engine: Engine) -> str:
    """Why `o.format` cannot be given (mtx/documents/; "" if it can)."""
    fmt = o.format
    if not o.documents:
        return ""
    if o.nbest > 1:
        return f"decode.format {fmt} gives one translation a text: no n-best"
    if o.alignments or o.attention:
        what = "alignments are" if o.alignments else "attention is"
        return f"decode.format {fmt}: {what} a sentence's, not a text's"
    marks = fmt != "paragraphs" or setup.placeholders
    if marks and (ALIGNMENTS not in engine.gives or not setup.capabilities.attention):
        needs = (
            "one checkpoint" if ALIGNMENTS in engine.gives else f"another engine than {engine.name}"
        )
        return (
            f"decode.format {fmt} puts marks back by the word alignment, read from one "
            f"model's attention: give {needs} (or paragraphs with no placeholders)"
        )
    return ""


def static_mode(search: str, device: str) -> str:
    """What decode.search runs on `device` ("cpu", "cuda"): shrinking, static or graphs."""
    if search == "auto":
        return "graphs" if device == "cuda" else "shrinking"
    return search


# ---- the runs: each imports what it runs (this module imports no torch) -------------------


def _greedy(rt, batch, o: Options) -> list:
    from mtx.decode.search import greedy_search

    return [[h] for h in greedy_search(rt.decoded(), batch, rt.settings(o))]


def _beam(rt, batch, o: Options) -> list:
    from mtx.decode.search import beam_search

    return beam_search(rt.decoded(), batch, rt.settings(o), o.nbest)


def _sample(rt, batch, o: Options) -> list:
    """`nbest` samples of each sentence, the best first: sample j of the request of line i
    drawn from the seed (decode.seed, i, j)."""
    from mtx.decode.rules import best
    from mtx.decode.search import Sampling, greedy_search

    n = o.nbest
    seeds = [[o.seed, r.line, j] for r in batch.requests for j in range(n)]
    sampling = Sampling(o.temperature, o.top_k, o.top_p)
    hyps = greedy_search(rt.decoded(), batch, rt.settings(o), sampling, seeds, copies=n)
    return [best(hyps[i : i + n], n) for i in range(0, len(hyps), n)]


def _constrained(rt, batch, o: Options) -> list:
    """Beam search under each request's controls; at beam 1 without a length penalty, so that
    it is greedy search."""
    from mtx.decode.controlled import ConstrainedBeam
    from mtx.decode.search import beam_search

    steer = ConstrainedBeam(batch.requests, o.beam, rt.device, rt.word_ends())
    settings = rt.settings(o, alpha=o.alpha if o.beam > 1 else 0.0)
    return beam_search(rt.model, batch, settings, o.nbest, steer)


def _alternatives(rt, batch, o: Options) -> list:
    """Greedy search, N rows a request, giving the N alternatives each asks for, best first."""
    from mtx.decode.controlled import Alternatives
    from mtx.decode.search import greedy_search

    n = batch.requests[0].controls.alternatives  # the runtime groups requests by it
    pick = Alternatives(batch.requests, n, rt.device, rt.word_ends())
    hyps = greedy_search(rt.model, batch, rt.settings(o), pick=pick, copies=n)
    return [hyps[i : i + n] for i in range(0, len(hyps), n)]


def _ctranslate2(rt, batch, o: Options) -> list:
    from mtx.decode.ct2 import translate_batch

    return translate_batch(rt, batch, o)


# ---- the rules of auto and the refusals ----------------------------------------------------


def _static_refusal(ask: Ask, mode: str) -> str:
    o, setup = ask.options, ask.setup
    if mode == "graphs" and setup.device != "cuda":
        return f"CUDA graphs need a CUDA device, not {setup.device}"
    if o.sampling:
        return "sampling runs in the shrinking search only"
    if setup.shortlist:
        return "decode.shortlist runs in the shrinking search only"
    if o.beam > 1 and o.stopping != "k_finished":
        return f"stopping {o.stopping} runs in the shrinking search only (static: k_finished)"
    if setup.languages.codes:
        return "an NLLB model's target-language start runs in the shrinking search only"
    return ""


def _static_auto(mode: str) -> Callable[[Ask], bool]:
    """decode.search `mode` asked by name, or graphs under auto on CUDA where it can run."""

    def auto(ask: Ask) -> bool:
        setup = ask.setup
        if static_mode(setup.search, setup.device) != mode:
            return False
        if setup.search == mode:
            return True  # asked by name: refused where it cannot run
        engine = ENGINES[mode]
        return not ask.controls and not engine.supports(ask)  # else the shrinking search

    return auto


def _draft_refusal(ask: Ask) -> str:
    o, setup = ask.options, ask.setup
    if not setup.draft:
        return "no draft model (set decode.draft)"
    if o.draft is False:
        return "the request asks for no drafts (draft false)"
    if o.beam != 1:
        return f"the drafts are verified by greedy search: set decode.beam 1 (not {o.beam})"
    if o.sampling:
        return "the drafts are verified by greedy search, not by decode.sampling"
    if setup.search in ("static", "graphs"):
        return f"it runs in the shrinking search, not decode.search {setup.search}"
    if setup.shortlist:
        return "it verifies over the whole vocabulary: not with decode.shortlist"
    if setup.recurrent:
        return (
            "the model's decoder is a recurrence (an SSRU): it verifies no faster than it decodes"
        )
    return ""


def _draft_auto(ask: Ask) -> bool:
    """A sentence without controls, and drafts asked (refused where they cannot run), or a
    draft model and nothing against it."""
    if ask.controls or ask.options.draft is False:
        return False
    return ask.options.draft is True or not ENGINES["drafts"].supports(ask)


def _no_shortlist(ask: Ask) -> str:
    if ask.setup.shortlist or ask.setup.capabilities.candidates:
        return "it runs without a lexical shortlist (decode.shortlist)"
    return ""


def _greedy_refusal(ask: Ask) -> str:
    return "" if ask.options.beam == 1 else f"set decode.beam 1 (not {ask.options.beam})"


def _sampling_refusal(ask: Ask) -> str:
    return "" if ask.options.sampling else "it draws each token: set decode.sampling true"


def _ct2_refusal(ask: Ask) -> str:
    o = ask.options
    if o.sampling:
        return "mtx runs no sampling through it: set decode.sampling false"
    return "" if ask.setup.device == "cpu" else f"it runs on the CPU here, not {ask.setup.device}"


CONTROLLED = frozenset({"prefix", "constraints", "avoid"})

register(Engine("drafts", "decode.draft", lambda rt, b, o: [[h] for h in rt.speculative(b, o)],
                needs=("ragged",), refuses=_draft_refusal, auto=_draft_auto))  # fmt: skip
for _mode in ("static", "graphs"):
    register(Engine(
        _mode, f"decode.search {_mode}",
        lambda rt, b, o, graphs=_mode == "graphs": rt.static(o, graphs)(b, o.nbest),
        needs=("static_cache",), refuses=lambda ask, m=_mode: _static_refusal(ask, m),
        auto=_static_auto(_mode), mixed=False,
    ))  # fmt: skip
register(Engine("sampling", "decode.sampling", _sample, refuses=_sampling_refusal,
                auto=lambda ask: ask.options.sampling))  # fmt: skip
register(Engine("alternatives", "alternatives", _alternatives, CONTROLLED - {"constraints"}
                | {"alternatives"}, refuses=_no_shortlist,
                auto=lambda ask: ask.controls.alternatives > 0, plural=True))  # fmt: skip
register(Engine("constrained", "the constrained beam search", _constrained, CONTROLLED,
                refuses=_no_shortlist, auto=lambda ask: bool(ask.controls)))  # fmt: skip
register(Engine("greedy", "greedy search", _greedy, refuses=_greedy_refusal,
                auto=lambda ask: ask.options.beam == 1))  # fmt: skip
register(Engine("beam", "beam search", _beam, auto=lambda ask: True))
register(Engine("ctranslate2", "ctranslate2", _ctranslate2, needs=("output_matrix",),
                refuses=_ct2_refusal, gives=frozenset()))  # fmt: skip
