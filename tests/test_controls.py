"""Steered translation as a user meets it (mtx/decode/controls.py): JSON lines, a glossary and
corpus translation through `mtx translate`, on the Multi30k fixture's model and test2016."""

import json
import random

import pytest
from conftest import MULTI30K
from helpers.common import invoke, mtx
from helpers.translating import outputs

from mtx.decode.controls import Controls, Line, parse_line
from mtx.decode.glossary import Glossary, contains
from mtx.decode.translator import Translator
from mtx.errors import MtxError

LINES = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:60]
REFS = (MULTI30K / "test2016.de").read_text(encoding="utf-8").splitlines()[:60]


@pytest.fixture(scope="module")
def checkpoint(multi30k_run):
    return multi30k_run / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def translator(checkpoint):
    return Translator.from_checkpoints(checkpoint, device="cpu")


def steered_lines(seed: int) -> list[Line]:
    """Each test line with controls of its own, drawn at random from its reference: a prefix
    (its first 1-2 words), a constraint (1-2 of its words), or nothing."""
    rng, out = random.Random(seed), []
    for src, ref in zip(LINES, REFS):
        words = ref.split()
        kind = rng.choice(("prefix", "constraint", "both", "none"))
        n = rng.randint(1, 2)
        start = rng.randrange(len(words) - n + 1)
        prefix = " ".join(words[:n]) if kind in ("prefix", "both") else ""
        need = (" ".join(words[start : start + n]),) if kind in ("constraint", "both") else ()
        out.append(Line(src, Controls(prefix=prefix, constraints=need)))
    return out


def test_json_lines_and_glossaries_are_read_or_refused_naming_the_line(tmp_path):
    line = parse_line('{"text": "a dog", "prefix": " Ein  Hund", "constraints": ["x y"]}', "line 1")
    assert line == Line("a dog", Controls(prefix="Ein Hund", constraints=("x y",)))
    for raw, words in (
        ("a dog", "line 7: not a JSON object"),
        ('["a dog"]', "line 7: not a JSON object but list"),
        ('{"txt": "a"}', "line 7: unknown key 'txt'"),
        ('{"text": 3}', "line 7: text must be a string"),
        ('{"text": "a", "constraints": ["ok", " "]}', r"line 7: constraints\[1\] is empty"),
        ('{"text": "a", "avoid": "no"}', "line 7: avoid must be a list of strings"),
        ('{"text": "a", "alternatives": -1}', "line 7: alternatives must be a whole number"),
    ):
        with pytest.raises(MtxError, match=words):
            parse_line(raw, "line 7")
    path = tmp_path / "g.tsv"
    path.write_text("# terms\nred car\tAuto\nDog\tHund\ndog\tRüde\n\n")
    g = Glossary.load(path)
    terms = g.terms("A DOG and a red car; a redcar.")
    assert [(t.source, t.targets) for t in terms] == [
        ("Dog", ("Hund", "Rüde")),
        ("red car", ("Auto",)),
    ]
    applied = g.apply(Line("a dog", Controls(constraints=("Hund",))), "line 1")
    assert applied.controls.constraints == ("Hund",)  # the first target, once
    assert terms[0].honoured("ein rüde.") and not terms[0].honoured("hunde")
    assert contains("Ein großer Hund.", "großer hund") and not contains("Hunde", "Hund")
    for text, words in (
        ("dog Hund", "line 1: no tab"),
        ("a\tb\tc", "line 1: more than one tab"),
        ("a\t,", "line 1: an empty term"),
    ):
        path.write_text(text + "\n")
        with pytest.raises(MtxError, match=f"{path} {words}"):
            Glossary.load(path)


def test_every_control_is_honoured_and_lines_without_controls_are_unchanged(translator):
    lines = steered_lines(seed=1)
    hyps = outputs(translator, lines)
    plain = outputs(translator, LINES)
    for line, h, p in zip(lines, hyps, plain):
        text = h[0].text
        assert text.startswith(line.controls.prefix)
        assert all(contains(text, c) for c in line.controls.constraints), (line, text)
        assert h[0].unmet == 0
        if not line.controls:
            assert (h[0].tokens, h[0].score) == (p[0].tokens, p[0].score)


def test_a_lines_output_with_its_controls_is_the_same_alone_and_in_any_batch(
    translator, checkpoint
):
    lines = steered_lines(seed=2)
    together = outputs(translator, lines)
    again = Translator.from_checkpoints(checkpoint, ["decode.batch_tokens=40"], device="cpu")
    small = outputs(again, lines[::-1])[::-1]
    for i, line in enumerate(lines):
        alone = outputs(translator, [line], i)[0][0]
        assert (alone.tokens, alone.score) == (together[i][0].tokens, together[i][0].score)
        assert (small[i][0].tokens, small[i][0].score) == (alone.tokens, alone.score)


def test_an_avoided_phrase_never_appears(translator):
    plain = [h[0].text for h in outputs(translator, LINES[:20])]
    lines = [Line(s, Controls(avoid=(p.split()[0],))) for s, p in zip(LINES[:20], plain)]
    for line, h in zip(lines, outputs(translator, lines)):
        ids = tuple(translator.parts.codec.vocab.target.encode(line.controls.avoid[0]))
        n = len(ids)
        assert not any(h[0].tokens[i : i + n] == ids for i in range(len(h[0].tokens)))
        # the phrase is what the unsteered output began with, and it is gone
        assert not h[0].text.startswith(line.controls.avoid[0] + " ")


def test_translate_json_glossary_and_their_report(checkpoint, tmp_path):
    rows = [{"text": LINES[0], "prefix": "Zwei"}, {"text": LINES[1], "constraints": ["Straße"]},
            {"text": LINES[2]}, {"text": LINES[3], "prefix": "Ein", "alternatives": 3}]  # fmt: skip
    result = mtx("translate", "--checkpoint", checkpoint, "--json", "--nbest", "2",
                 input="".join(json.dumps(r) + "\n" for r in rows))  # fmt: skip
    out = [json.loads(x) for x in result.stdout.splitlines()]
    assert len(out) == 4 and out[0]["translation"].startswith("Zwei")
    alternatives = [a["translation"] for a in out[3]["alternatives"]]
    assert len(alternatives) == 3 and all(a.startswith("Ein ") for a in alternatives)
    assert len({a.split()[1] for a in alternatives}) == 3  # three different next words
    assert "Straße" in out[1]["translation"] and out[1]["unmet"] == 0
    assert len(out[2]["nbest"]) == 2 and out[2]["nbest"][0]["translation"] == out[2]["translation"]
    plain = mtx("translate", "--checkpoint", checkpoint, input=LINES[2] + "\n").stdout
    assert out[2]["translation"] + "\n" == plain
    assert "constraints: 1 of 1 met in 1 lines" in result.stderr
    glossary = tmp_path / "g.tsv"
    glossary.write_text("man\tKerl\n")
    result = mtx("translate", "--checkpoint", checkpoint, "--glossary", glossary,
                 input="A man sleeps.\nTwo dogs.\n")  # fmt: skip
    first, second = result.stdout.splitlines()
    assert "Kerl" in first and "Kerl" not in second
    assert "glossary: 1 of 1 terms honoured (100.0%)" in result.stderr


def test_bad_controls_are_refused_in_one_line_naming_the_line(checkpoint, tmp_path):
    good = json.dumps({"text": LINES[0]})
    for raw, words in (
        ('{"text": "a"', "line 2: not a JSON object"),
        ('{"text": "a", "constraints": [""]}', "line 2: constraints[0] is empty"),
        (
            json.dumps({"text": "A dog.", "prefix": " ".join(["Hund"] * 80)}),
            "line 2: the prefix has",
        ),
        (
            json.dumps({"text": "A dog.", "prefix": "Ein Hund", "avoid": ["Hund"]}),
            "line 2: the prefix holds the avoided phrase 'Hund'",
        ),
    ):
        src = tmp_path / "in.jsonl"
        src.write_text(f"{good}\n{raw}\n")
        out = tmp_path / "out.jsonl"
        r = invoke(
            "translate", "--checkpoint", checkpoint, "--json", "--input", src, "--output", out
        )
        assert r.exit_code != 0 and words in r.output.replace("\n", " "), r.output
        assert len(r.output.strip().splitlines()) == 1
        assert not out.exists()  # every line is checked before anything is written
    bad = tmp_path / "bad.tsv"
    bad.write_text("dog Hund\n")
    r = invoke("translate", "--checkpoint", checkpoint, "--glossary", bad, input="a\n")
    assert r.exit_code != 0 and f"{bad} line 1: no tab" in r.output


def test_corpus_translation_with_controls_resumes_to_the_same_file(checkpoint, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": x.text, "prefix": x.controls.prefix,
                                       "constraints": list(x.controls.constraints)}) + "\n"
                           for x in steered_lines(seed=3)[:24]))  # fmt: skip
    glossary = tmp_path / "g.tsv"
    glossary.write_text("dog\tHund\n")
    args = ("translate", "--checkpoint", checkpoint, "--json", "--glossary", glossary,
            "--input", src, "--chunk-lines", "4")  # fmt: skip
    whole = tmp_path / "whole.jsonl"
    mtx(*args, "--output", whole)
    lines = whole.read_bytes().splitlines(keepends=True)
    assert len(lines) == 24
    cut = tmp_path / "cut.jsonl"
    mtx(*args, "--output", cut)
    cut.write_bytes(b"".join(lines[:9]) + lines[9][:5])  # as a kill leaves it
    mtx(*args, "--output", cut, "--resume")
    assert cut.read_bytes() == whole.read_bytes()
    glossary.write_text("dog\tRüde\n")  # another glossary: not what the run began with
    r = invoke(*args, "--output", cut, "--resume")
    assert r.exit_code != 0 and "--resume: reads.glossary is" in r.output
