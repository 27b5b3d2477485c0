"""What grows is declared once: a sentence's controls (mtx/decode/controls.py) and the
engines that decode (mtx/decode/engines.py). A control and an engine declared in one place
(helpers/madeup.py) are read by `mtx translate --json`, corpus translation and a real `mtx
serve`; the engine is chosen by config (decode.engine) and by auto for what its declaration
says, reaches the sentences it takes, and everything it does not take is refused in one line,
naming the line."""

import json

import pytest
from conftest import MULTI30K
from helpers import madeup
from helpers.common import invoke, mtx

from mtx.bench.server import Server
from mtx.decode import engines
from mtx.decode.controls import CONTROLS, Controls, Line, parse_line
from mtx.decode.glossary import Glossary
from mtx.errors import MtxError

LINES = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:4]
REFUSED = "the constrained beam search takes no tone"


@pytest.fixture(scope="module")
def checkpoint(multi30k_run):
    return multi30k_run / "checkpoints" / "best.pt"


@pytest.fixture
def madeup_declared():
    """`declare` for one test: what it declares is forgotten after it."""
    controls, table = dict(CONTROLS), dict(engines.ENGINES)
    yield madeup
    CONTROLS.clear()
    CONTROLS.update(controls)
    engines.ENGINES.clear()
    engines.ENGINES.update(table)


def jsonl(tmp_path, rows: list[dict] | None = None, name: str = "in.jsonl"):
    rows = rows or [{"text": x} | ({"tone": "formal"} if i == 1 else {}) for i, x in
                    enumerate(LINES)]  # fmt: skip
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def texts(output: str) -> list[str]:
    return [json.loads(x)["translation"] for x in output.splitlines()]


def test_an_undeclared_control_is_an_unknown_key(checkpoint, tmp_path):
    r = invoke("translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path).read_text())
    assert r.exit_code != 0 and "line 2: unknown key 'tone'" in r.output


def test_a_declared_control_no_engine_takes_is_refused_in_one_line(
    checkpoint, tmp_path, madeup_declared
):
    madeup_declared.declare(engine=False)
    assert parse_line('{"text": "a", "tone": " very  formal"}', "line 1").controls.tone == (
        "very formal"
    )
    with pytest.raises(MtxError, match="line 4: tone must be a string"):
        parse_line('{"text": "a", "tone": 3}', "line 4")
    r = invoke("translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path).read_text())
    assert r.exit_code == 2 and f"line 2: {REFUSED}" in r.output
    out = tmp_path / "out.jsonl"
    r = invoke("translate", "--checkpoint", checkpoint, "--json", "--input", jsonl(tmp_path),
               "--output", out)  # fmt: skip
    assert r.exit_code == 2 and f"line 2: {REFUSED}" in r.output and not out.exists()


def test_the_engine_auto_chooses_for_a_control_decodes_it_alone_in_translate_and_corpus_jobs(
    checkpoint, tmp_path, madeup_declared
):
    madeup_declared.declare()
    plain = mtx("translate", "--checkpoint", checkpoint, input="\n".join(LINES) + "\n")
    toned = mtx(
        "translate", "--checkpoint", checkpoint, "--json", input=jsonl(tmp_path).read_text()
    )
    got = texts(toned.stdout)
    # line 2 has a tone: echoed, with its tone; the others as without the made-up engine
    assert got[1] == LINES[1] + " formal" and got[0] != LINES[0]
    assert [got[i] for i in (0, 2, 3)] == [plain.stdout.splitlines()[i] for i in (0, 2, 3)]
    out = tmp_path / "out.jsonl"
    mtx("translate", "--checkpoint", checkpoint, "--json", "--input", jsonl(tmp_path),
        "--output", out)  # fmt: skip
    assert out.read_text() == toned.stdout


def test_an_engine_chosen_by_config_decodes_everything_and_refuses_what_it_does_not_take(
    checkpoint, tmp_path, madeup_declared
):
    madeup_declared.declare()
    echo = ("--checkpoint", checkpoint, "--set", "decode.engine=echo")
    out = mtx("translate", *echo, input="\n".join(LINES) + "\n")
    assert out.stdout.splitlines() == LINES  # each its own source: the echo engine's
    (tmp_path / "in.en").write_text("\n".join(LINES) + "\n")
    mtx("translate", *echo, "--input", tmp_path / "in.en", "--output", tmp_path / "out.de")
    assert (tmp_path / "out.de").read_text().splitlines() == LINES
    prefixed = [{"text": LINES[0]}, {"text": LINES[1], "prefix": "Ein"}]
    r = invoke("translate", *echo, "--json", input=jsonl(tmp_path, prefixed).read_text())
    assert r.exit_code == 2 and "line 2: the echo engine takes no prefix" in r.output
    r = invoke("translate", *echo, "--alignments", input=LINES[0] + "\n")
    assert r.exit_code == 2 and "the echo engine gives no alignments" in r.output
    r = invoke("translate", *echo, "--format", "html", input=LINES[0] + "\n")
    assert r.exit_code == 2 and "decode.format html puts marks back by the word alignment" in (
        r.output
    )
    r = invoke("translate", "--checkpoint", checkpoint, "--set", "decode.engine=nothing",
               input="a\n")  # fmt: skip
    assert r.exit_code == 2 and "decode.engine: no engine named 'nothing' (auto, drafts" in (
        r.output
    )


@pytest.mark.parametrize("declared", ["control", "engine"])
def test_a_real_server_reads_both_declarations(checkpoint, declared, monkeypatch):
    """The control alone: refused by the engine chosen for it. The engine, chosen by config
    (decode.engine=echo): every text echoed, a tone read, what it does not take refused."""
    texts = [LINES[0], {"text": LINES[1], "tone": "formal"}]
    monkeypatch.setenv("MADEUP", declared)
    sets = ("serve.workers=1", *(() if declared == "control" else ("decode.engine=echo",)))
    with Server(checkpoint, *sets, program=(madeup.__file__,)) as s:
        status, answer = s.translate(texts)
        if declared == "control":
            assert status == 422 and answer["error"] == f"text[1]: {REFUSED}"
            assert s.stop() == 0
            return
        assert status == 200 and answer["translations"] == [LINES[0], LINES[1] + " formal"]
        status, answer = s.translate([{"text": LINES[0], "prefix": "A"}])
        assert status == 422 and answer["error"] == "text: the echo engine takes no prefix"
        status, answer = s.translate(LINES[:1], alignments=True)
        assert status == 422 and answer["error"] == "the echo engine gives no alignments"
        assert s.get("/info")[2]["attention"] is False  # the page asks for none
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


def test_each_engine_declares_the_controls_it_takes_and_every_control_is_taken():
    for engine in engines.ENGINES.values():
        assert engine.takes <= set(CONTROLS), engine.name
    assert set(CONTROLS) == set().union(*(e.takes for e in engines.ENGINES.values()))
