"""A request's options, one typed record (mtx/decode/options.py): its fields that are decode.*
settings take their declaration from the config, each field is checked in one line, and a
corpus job records those that change an output."""

import dataclasses
import json
import typing

import pytest

from mtx.config import DecodeConfig
from mtx.config.decode import Format, Stopping
from mtx.decode.options import Options, names, recorded_settings
from mtx.decode.rules import SearchSettings
from mtx.errors import MtxError

SHARED = [f.name for f in dataclasses.fields(Options) if "setting" in f.metadata]


def test_the_shared_fields_are_the_configs_declarations():
    config = {f.name: f for f in dataclasses.fields(DecodeConfig)}
    assert set(SHARED) >= {"beam", "alpha", "max_len_a", "max_len_b", "stopping", "alignments"}
    for name in SHARED:
        f = Options.__dataclass_fields__[name]
        assert f.default == config[name].default, name
        assert f.metadata["doc"] == config[name].metadata["doc"], name
    # a request's draft is whether to use the translator's (decode.draft names its model)
    assert "setting" not in Options.__dataclass_fields__["draft"].metadata
    hints = typing.get_type_hints(Options)
    assert hints["stopping"] is Stopping and hints["format"] is Format  # Literals, not str
    assert typing.get_type_hints(SearchSettings)["stopping"] is Stopping


def test_options_of_a_translators_settings_with_what_is_given():
    d = DecodeConfig(beam=5, alpha=0.2, format="html")
    o = Options.of(d, nbest=2, tgt_lang="de")
    assert (o.beam, o.alpha, o.format, o.nbest, o.tgt_lang, o.draft) == (
        5,
        0.2,
        "html",
        2,
        "de",
        None,
    )
    assert Options() == Options.of(DecodeConfig())
    with pytest.raises(MtxError, match=r"^no option named 'bem' \(options: beam, nbest, "):
        Options.of(d, bem=2)


@pytest.mark.parametrize(
    "given, message",
    [
        ({"beam": 0}, "beam must be positive, got 0"),
        ({"nbest": 0}, "nbest must be at least 1, got 0"),
        ({"beam": 2, "nbest": 3}, "nbest 3 needs a beam of at least 3 (or sampling)"),
        ({"format": "pdf"}, "format must be plain, paragraphs, html or xml, got 'pdf'"),
        ({"stopping": "soon"}, "stopping must be k_finished, exact or never, got 'soon'"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ],
)
def test_each_field_is_checked_in_one_line(given, message):
    with pytest.raises(MtxError) as e:
        Options(**given)
    assert str(e.value) == message


def test_sampling_may_give_more_samples_than_the_beam():
    assert Options(beam=1, nbest=4, sampling=True).nbest == 4


def test_a_corpus_job_records_what_changes_an_output_typed():
    o = Options(beam=2, draft=True, alignments=True)
    recorded = o.recorded()
    assert "draft" not in recorded and recorded["beam"] == 2 and recorded["alignments"] is True
    assert Options.from_json(json.loads(json.dumps(o.to_json())), "x") == o
    with pytest.raises(MtxError, match="^x: the options recorded there are not this mtx's"):
        Options.from_json({"beem": 2}, "x")
    settings = recorded_settings(DecodeConfig(batch_tokens=7, draft="d.pt", dtype="int8"))
    assert settings["dtype"] == "int8" and settings["engine"] == "auto"
    assert not {"batch_tokens", "draft", "draft_tokens", "draft_adaptive"} & set(settings)


def test_a_search_is_told_its_settings_from_the_options():
    o = Options(beam=3, alpha=0.1, max_len_a=1.5, max_len_b=7, stopping="exact")
    s = SearchSettings.of(o, 99)
    assert (s.beam, s.alpha, s.max_len_a, s.max_len_b, s.limit, s.stopping) == (
        3, 0.1, 1.5, 7, 99, "exact"
    )  # fmt: skip
    assert SearchSettings() == SearchSettings.of(Options(), 1024)
    assert names()[:2] == ("beam", "nbest")
