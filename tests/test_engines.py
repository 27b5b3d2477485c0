"""The engine table (mtx/decode/engines.py): which engine decodes a sentence under each setting,
and every refusal, derived from the engines' declarations and the model's capabilities; the
table and the options record are read without torch (the server's own process)."""

import subprocess
import sys

import pytest

from mtx.config import DecodeConfig
from mtx.decode import engines
from mtx.decode.controls import Controls
from mtx.decode.engines import Setup
from mtx.decode.languages import Languages
from mtx.decode.options import Options
from mtx.errors import MtxError
from mtx.model.capabilities import Capabilities

TRANSFORMER = Capabilities(
    mixed_lengths=True, static_cache=True, output_matrix=True, attention=True, ragged=True
)
ENSEMBLE = Capabilities(log_probs=True, mixed_lengths=True)
ONE = Languages("one", {}, ("de",), "en", "de")
NLLB = Languages("codes", {"eng_Latn": 5, "deu_Latn": 6}, ("deu_Latn", "eng_Latn"), "eng_Latn",
                 "deu_Latn")  # fmt: skip


def setup(caps=TRANSFORMER, languages=ONE, device="cpu", model="Transformer", **decode):
    d = DecodeConfig(**decode)
    return Setup.of(d, caps, languages, device=device, model=model), d


def chosen(controls=Controls(), caps=TRANSFORMER, languages=ONE, device="cpu", asked=None,
           **decode) -> str:  # fmt: skip
    s, d = setup(caps, languages, device, **decode)
    return engines.check(controls, Options.of(d, **(asked or {})), s).name


def refusal(controls=Controls(), caps=TRANSFORMER, languages=ONE, device="cpu", asked=None,
            model="Transformer", **decode) -> str:  # fmt: skip
    s, d = setup(caps, languages, device, model, **decode)
    with pytest.raises(MtxError) as e:
        engines.check(controls, Options.of(d, **(asked or {})), s, "line 3")
    return str(e.value)


def test_auto_chooses_as_the_settings_and_a_sentences_controls_say():
    assert chosen() == "beam" and chosen(beam=1) == "greedy"
    assert chosen(sampling=True) == "sampling"
    assert chosen(beam=1, draft="d.pt") == "drafts"
    assert chosen(beam=4, draft="d.pt") == "beam"  # a request at beam 4: no drafts, no refusal
    assert chosen(beam=1, draft="d.pt", asked={"draft": False}) == "greedy"
    assert chosen(search="static") == "static"
    assert chosen(device="cuda") == "graphs"  # auto on CUDA
    assert chosen(device="cuda", sampling=True) == "sampling"  # where graphs cannot run
    assert chosen(device="cuda", languages=NLLB, asked={"tgt_lang": "deu_Latn"}) == "beam"
    assert chosen(Controls(prefix="a")) == "constrained"
    assert chosen(Controls(alternatives=2)) == "alternatives"
    assert chosen(Controls(prefix="a"), device="cuda") == "constrained"
    assert chosen(Controls(avoid=("x",)), beam=1, draft="d.pt") == "constrained"  # not drafts
    assert chosen(engine="greedy", beam=1) == "greedy"


@pytest.mark.parametrize(
    "controls, settings, message",
    [
        (Controls(prefix="a"), {"search": "static"}, "line 3: decode.search static takes no prefix"),
        (Controls(prefix="a"), {"sampling": True}, "line 3: decode.sampling takes no prefix"),
        (Controls(alternatives=2, constraints=("b",)), {}, "line 3: alternatives take no constraints"),
        (Controls(prefix="a"), {"shortlist": "s.npz"}, "runs without a lexical shortlist"),
        (Controls(), {"search": "graphs"}, "CUDA graphs need a CUDA device, not cpu"),
        (Controls(), {"search": "static", "sampling": True}, "sampling runs in the shrinking"),
        (Controls(), {"search": "static", "stopping": "exact"}, "stopping exact runs in the"),
        (Controls(), {"search": "static", "languages": NLLB, "asked": {"tgt_lang": "deu_Latn"}},
         "an NLLB model's target-language start runs in the shrinking search only"),
        (Controls(), {"engine": "greedy"}, "greedy search: set decode.beam 1 (not 4)"),
        (Controls(), {"engine": "nothing"}, "decode.engine: no engine named 'nothing' (auto, "),
        (Controls(), {"draft": "d.pt", "asked": {"draft": True}},
         "decode.draft: the drafts are verified by greedy search: set decode.beam 1 (not 4)"),
        (Controls(), {"draft": "d.pt", "beam": 1, "sampling": True, "asked": {"draft": True}},
         "not by decode.sampling"),
        (Controls(), {"asked": {"draft": True}, "beam": 1}, "no draft model (set decode.draft)"),
        (Controls(), {"asked": {"tgt_lang": "fr"}}, "'fr' is not one this model translates into"),
        (Controls(), {"asked": {"nbest": 2}, "format": "html", "beam": 2},
         "decode.format html gives one translation a text: no n-best"),
        (Controls(), {"format": "xml", "alignments": True},
         "decode.format xml: alignments are a sentence's, not a text's"),
        (Controls(), {"engine": "ctranslate2", "alignments": True}, "ctranslate2 gives no alignments"),
        (Controls(prefix="a"), {"engine": "ctranslate2"}, "ctranslate2 takes no prefix"),
        (Controls(), {"engine": "ctranslate2", "format": "html"},
         "give another engine than ctranslate2"),
    ],
)  # fmt: skip
def test_every_refusal_comes_from_the_table_in_one_line(controls, settings, message):
    settings = dict(settings)
    asked, languages = settings.pop("asked", None), settings.pop("languages", ONE)
    why = refusal(controls, languages=languages, asked=asked, **settings)
    assert message in why and "\n" not in why


def test_an_ensembles_refusals_come_from_its_capabilities():
    ensemble = dict(caps=ENSEMBLE, model="Ensemble")
    assert "decode.alignments reads one model's attention: give one checkpoint" in refusal(
        alignments=True, **ensemble
    )
    assert "decode.attention reads one model's attention" in refusal(
        asked={"attention": True}, **ensemble
    )
    assert "decode.search static: Ensemble has no static cache" in refusal(
        search="static", **ensemble
    )
    assert "decode.draft: Ensemble has no cache of rows at positions of their own" in refusal(
        beam=1, draft="d.pt", asked={"draft": True}, **ensemble
    )
    assert "puts marks back by the word alignment" in refusal(format="html", **ensemble)
    assert "ctranslate2: Ensemble has no single output matrix (one checkpoint" in refusal(
        engine="ctranslate2", **ensemble
    )
    s, d = setup(ENSEMBLE, format="paragraphs", placeholders=[])
    assert engines.check(Controls(), Options.of(d), s).name == "beam"  # nothing to put back


def test_an_engine_registered_once_is_chosen_and_refused_as_declared(monkeypatch):
    monkeypatch.setattr(engines, "ENGINES", dict(engines.ENGINES))
    mine = engines.Engine("mine", "my engine", lambda rt, b, o: [], takes=frozenset({"avoid"}),
                          auto=lambda ask: ask.options.beam == 7)  # fmt: skip
    engines.register(mine, before="greedy")
    assert list(engines.ENGINES).index("mine") == list(engines.ENGINES).index("greedy") - 1
    assert chosen(beam=7) == "mine" and chosen(beam=4) == "beam"
    assert chosen(Controls(avoid=("x",)), engine="mine") == "mine"
    assert "line 3: my engine takes no prefix" in refusal(Controls(prefix="a"), engine="mine")
    with pytest.raises(ValueError, match="registered already"):
        engines.register(mine)


def test_the_table_and_the_options_are_read_without_torch():
    code = (
        "import sys; import mtx.decode.engines, mtx.decode.options, mtx.decode.codec, "
        "mtx.serve.front; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
