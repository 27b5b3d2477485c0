"""A sentence's controls are declared once (mtx/decode/controls.py), and which search takes
which once (mtx/decode/dispatch.py): a control declared in one place (helpers/madeup.py) is
read by `mtx translate --json`, corpus translation and `mtx serve`, reaches the search that
declares it, and is refused in one line by a search that does not."""

import json

import pytest
from conftest import MULTI30K
from helpers import madeup
from helpers.common import invoke, mtx

from mtx.bench.server import Server
from mtx.config import DecodeConfig
from mtx.decode import dispatch
from mtx.decode.controls import CONTROLS, Controls, Line, parse_line
from mtx.decode.glossary import Glossary
from mtx.decode.searches import Searches
from mtx.errors import MtxError

LINES = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:4]
REFUSED = "the constrained beam search takes no tone"


@pytest.fixture(scope="module")
def checkpoint(multi30k_run):
    return multi30k_run / "checkpoints" / "best.pt"


@pytest.fixture
def tone(monkeypatch):
    """`tone` declared for one test (and forgotten after it)."""
    monkeypatch.setitem(CONTROLS, "tone", madeup.TONE)
    monkeypatch.setattr(dispatch, "CONSTRAINED", dispatch.CONSTRAINED)
    return madeup


def jsonl(tmp_path, tone: str | None = "formal"):
    path = tmp_path / "in.jsonl"
    rows = [{"text": x} | ({"tone": tone} if tone and i == 1 else {}) for i, x in enumerate(LINES)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_undeclared_control_is_an_unknown_key(checkpoint, tmp_path):
    r = invoke("translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path).read_text())
    assert r.exit_code != 0 and "line 2: unknown key 'tone'" in r.output


def test_a_declared_control_is_read_and_refused_by_the_search_that_does_not_take_it(
    checkpoint, tmp_path, tone
):
    tone.declare()
    assert parse_line('{"text": "a", "tone": " very  formal"}', "line 1").controls.tone == (
        "very formal"
    )
    with pytest.raises(MtxError, match="line 4: tone must be a string"):
        parse_line('{"text": "a", "tone": 3}', "line 4")
    r = invoke("translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path).read_text())
    assert r.exit_code == 2 and f"line 2: {REFUSED}" in r.output
    out = tmp_path / "out.jsonl"
    args = ("--json", "--input", jsonl(tmp_path), "--output", out)
    r = invoke("translate", "--checkpoint", checkpoint, *args)
    assert r.exit_code == 2 and f"line 2: {REFUSED}" in r.output
    with pytest.raises(MtxError, match="line 2: decode.sampling takes no tone"):
        dispatch.check(Controls(tone="x"), DecodeConfig(sampling=True), "line 2")


def test_a_declared_control_reaches_the_search_that_takes_it(
    checkpoint, tmp_path, tone, monkeypatch
):
    tone.declare(taken=True)
    seen = []
    run = Searches.run

    def spy(self, search, n, batch, d, nbest):
        seen.extend(r.controls for r in batch.requests)
        return run(self, search, n, batch, d, nbest)

    monkeypatch.setattr(Searches, "run", spy)
    plain = mtx(
        "translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path, None).read_text()
    )
    toned = mtx(
        "translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path).read_text()
    )
    # the constrained beam search decodes the line as the plain one (it reads nothing of tone)
    assert [json.loads(x)["translation"] for x in toned.stdout.splitlines()] == [
        json.loads(x)["translation"] for x in plain.stdout.splitlines()
    ]
    got = [c.tone for c in seen if c]
    assert len(got) == 1 and got[0] and all(isinstance(i, int) for i in got[0])  # its target ids
    out = tmp_path / "out.jsonl"
    mtx(
        "translate",
        "--checkpoint",
        checkpoint,
        "--json",
        "--input",
        jsonl(tmp_path),
        "--output",
        out,
    )
    assert out.read_text() == toned.stdout


@pytest.mark.parametrize("taken", [False, True])
def test_a_control_declared_in_the_server_is_accepted_or_refused_as_its_search_says(
    checkpoint, taken, monkeypatch
):
    texts = [LINES[0], {"text": LINES[1], "tone": "formal"}]
    with Server(checkpoint, "serve.workers=1") as plain:
        status, answer = plain.translate(texts)
        assert status == 422 and answer["error"].startswith("text[1].tone: Extra inputs")
        assert plain.stop() == 0
    monkeypatch.setenv("MADEUP_TAKEN", "1" if taken else "0")
    with Server(checkpoint, "serve.workers=1", program=(madeup.__file__,)) as s:
        status, answer = s.translate(texts)
        if taken:
            assert status == 200 and len(answer["results"]) == 2, answer
        else:
            assert status == 422 and answer["error"] == f"text[1]: {REFUSED}"
        assert s.stop() == 0


def test_a_glossary_keeps_a_lines_alternatives_or_refuses_them_naming_the_line(
    checkpoint, tmp_path
):
    """A glossary adds its terms to a line's constraints; a line asking for alternatives keeps
    them where no term is found, and is refused in one line where one is (alternatives take no
    constraints)."""
    glossary = tmp_path / "g.tsv"
    glossary.write_text("dog\tHund\n")
    g = Glossary.load(glossary)
    asked = Line("a man paints a ball.", Controls(alternatives=3, prefix="Ein"))
    assert g.apply(asked, "line 1") == asked
    with pytest.raises(
        MtxError, match="line 2: alternatives take no constraints, and the glossary's term 'dog'"
    ):
        g.apply(Line("a dog runs.", Controls(alternatives=3)), "line 2")
    rows = [{"text": LINES[0], "alternatives": 3}]
    src = "".join(json.dumps(r) + "\n" for r in rows)
    with_glossary = mtx(
        "translate", "--checkpoint", checkpoint, "--json", "--glossary", glossary, input=src
    )
    without = mtx("translate", "--checkpoint", checkpoint, "--json", input=src)
    answer = json.loads(with_glossary.stdout)
    assert len(answer["alternatives"]) == 3 and with_glossary.stdout == without.stdout
    rows.append({"text": "A dog runs.", "alternatives": 3})
    src = "".join(json.dumps(r) + "\n" for r in rows)
    r = invoke("translate", "--checkpoint", checkpoint, "--json", "--glossary", glossary, input=src)
    assert r.exit_code == 2 and "line 2: alternatives take no constraints" in r.output


def test_each_search_declares_the_controls_it_takes():
    plain = DecodeConfig()
    assert dispatch.choose(Controls(), plain) is dispatch.BEAM
    assert dispatch.choose(Controls(prefix="a"), plain) is dispatch.CONSTRAINED
    assert dispatch.choose(Controls(alternatives=2), plain) is dispatch.ALTERNATIVES
    with pytest.raises(MtxError, match="^line 7: alternatives take no constraints$"):
        dispatch.check(Controls(alternatives=2, constraints=("b",)), plain, "line 7")
    static = DecodeConfig(search="static")
    assert dispatch.choose(Controls(), static) is dispatch.STATIC
    with pytest.raises(MtxError, match="decode.search static or graphs takes no prefix"):
        dispatch.check(Controls(prefix="a"), static)
    for search in dispatch.SEARCHES:
        assert search.takes <= set(CONTROLS), search
    assert set(CONTROLS) == set().union(*(s.takes for s in dispatch.SEARCHES))  # each is taken
