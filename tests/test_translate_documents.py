"""Documents translated by a model (decode/documents.py): `mtx translate --format` (lines,
JSON lines, corpus translation with --resume, --document) and `mtx serve`'s `format`.

The model is the Multi30k fixture's (conftest.py, en -> de); the texts are test2016's. A
sentence's translation does not depend on its batch, so a paragraph's translation is exactly
its sentences' translations joined, and a marked-up sentence's text is exactly the plain
sentence's translation.
"""

import json
import random
import subprocess
import sys
from collections import Counter

import lxml.etree as etree
import lxml.html
import pytest
from conftest import MULTI30K
from helpers.common import invoke, mtx

from mtx.bench.server import Server
from mtx.decode.translator import Translator
from mtx.documents.sentences import split

LINES = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()[:40]
TAGS = [("b", ""), ("i", ""), ("a", ' href="/x?a=1&amp;b=2"'), ("span", ' class="k"')]


@pytest.fixture(scope="module")
def checkpoint(multi30k_run):
    return multi30k_run / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def plain(checkpoint):
    """Each of LINES translated as one sentence (`mtx translate`)."""
    out = mtx("translate", "--checkpoint", checkpoint, input="\n".join(LINES) + "\n")
    return dict(zip(LINES, out.stdout.splitlines()))


def tagged(line: str, rng: random.Random) -> str:
    """`line` with one or two inline elements around word spans (one nested in the other)."""
    words = line.split()
    a = rng.randrange(len(words))
    b = rng.randrange(a, len(words)) + 1
    tag, attrs = rng.choice(TAGS)
    if b - a > 2 and rng.random() < 0.5:
        words[a + 1] = f"<i>{words[a + 1]}</i>"
    words[a] = f"<{tag}{attrs}>{words[a]}"
    words[b - 1] = f"{words[b - 1]}</{tag}>"
    return " ".join(words)


def elements(text: str) -> Counter:
    root = lxml.html.fragment_fromstring(text, create_parent="r")
    return Counter((n.tag, tuple(sorted(n.attrib.items()))) for n in list(root.iter())[1:])


def text_of(fragment: str) -> str:
    root = lxml.html.fragment_fromstring(fragment, create_parent="r")
    return " ".join("".join(root.itertext()).split())


def test_a_paragraph_is_its_sentences_translations_joined(checkpoint, plain):
    paragraphs = [LINES[i : i + 4] for i in range(0, 24, 4)]
    joined = [" ".join(p) for p in paragraphs]
    out = mtx("translate", "--checkpoint", checkpoint, "--format", "paragraphs",
              input="\n".join(joined) + "\n").stdout.splitlines()  # fmt: skip
    assert len(out) == len(paragraphs)
    exact = 0
    for p, text, translation in zip(paragraphs, joined, out):
        if len(split(text, "en")) == len(p):  # the splitter found the sentences
            assert translation == " ".join(plain[s] for s in p)
            exact += 1
    assert exact >= len(paragraphs) - 1


def test_html_keeps_every_element_and_its_text_is_the_plain_translation(checkpoint, plain):
    rng = random.Random(7)
    sources = [f"<p>{tagged(line, rng)}</p>" for line in LINES[:20]]
    out = mtx("translate", "--checkpoint", checkpoint, "--format", "html",
              input="\n".join(sources) + "\n").stdout.splitlines()  # fmt: skip
    assert len(out) == len(sources)
    for line, source, translation in zip(LINES, sources, out):
        assert translation.startswith("<p>") and translation.endswith("</p>")
        assert elements(translation) == elements(source)
        assert text_of(translation) == " ".join(plain[line].split())


def test_a_lines_translation_is_the_same_alone_and_in_any_batch(checkpoint):
    rng = random.Random(3)
    items = [f"<p>{tagged(a, rng)} {{name}} {b}</p>" for a, b in zip(LINES[:12], LINES[12:24])]
    html = {"format": "html"}
    together = Translator.from_checkpoints(checkpoint, device="cpu", decode=html)
    small = Translator.from_checkpoints(
        checkpoint, device="cpu", decode=html | {"batch_tokens": 40}
    )
    all_at_once = [t.best.text for t in together.translate(items)]
    alone = [small.translate([x], first=i)[0].best.text for i, x in enumerate(items)]
    assert all_at_once == alone
    assert all(x.count("{name}") == 1 for x in all_at_once)


def test_placeholders_come_out_verbatim_as_often_as_they_went_in(checkpoint):
    sources = [
        "Hello {name}, two dogs play %d times with $OWNER.",
        "A man %1$s rides a {{ vehicle }} and a {bike} and a {bike}.",
        'A woman <x id="1"/> sings %s and %% loudly.',
    ]
    out = mtx("translate", "--checkpoint", checkpoint, "--format", "paragraphs",
              input="\n".join(sources) + "\n").stdout.splitlines()  # fmt: skip
    for source, translation in zip(sources, out, strict=True):
        for p in ("{name}", "%d", "$OWNER", "%1$s", "{{ vehicle }}", "{bike}", '<x id="1"/>',
                  "%s", "%%"):  # fmt: skip
            assert translation.count(p) == source.count(p), (p, translation)


def test_a_whole_page_from_stdin(checkpoint):
    page = (
        "<!DOCTYPE html>\n<html>\n<head><title>Dogs &amp; people</title>\n"
        "<style>p > b { color: red }</style></head>\n<body>\n<h1>Two dogs</h1>\n"
        f"<p>{LINES[0]}\n{LINES[1]}</p>\n<ul><li>{LINES[2]}</li><li><a href='#'>{LINES[3]}</a>"
        "</li></ul>\n<script>if (a < b && c) { run(); }</script>\n</body>\n</html>\n"
    )
    out = mtx("translate", "--checkpoint", checkpoint, "--format", "html", "--document",
              input=page).stdout  # fmt: skip
    root = lxml.html.document_fromstring(out)
    before = lxml.html.document_fromstring(page)
    assert [e.tag for e in root.iter()] == [e.tag for e in before.iter()]
    assert "<script>if (a < b && c) { run(); }</script>" in out
    assert "<style>p > b { color: red }</style>" in out
    assert out.startswith("<!DOCTYPE html>") and LINES[0] not in out


def test_json_lines_avoid_in_each_sentence_and_one_sentence_controls_refused(checkpoint):
    rows = [{"text": f"<p>{LINES[0]} {LINES[1]}</p>", "avoid": ["Mann"]}, {"text": LINES[2]}]
    out = mtx("translate", "--checkpoint", checkpoint, "--format", "html", "--json",
              input="".join(json.dumps(r) + "\n" for r in rows)).stdout.splitlines()  # fmt: skip
    results = [json.loads(x) for x in out]
    assert set(results[0]) == {"translation", "score", "log_prob", "unmet"}
    assert "Mann" not in results[0]["translation"].replace(".", " ").split()
    bad = invoke("translate", "--checkpoint", checkpoint, "--format", "html", "--json",
                 input=json.dumps({"text": "<p>x</p>", "prefix": "Ein"}) + "\n")  # fmt: skip
    assert bad.exit_code != 0
    assert "line 1: prefix is one sentence's" in bad.output


def test_a_glossary_term_is_found_in_each_sentence(checkpoint, tmp_path):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tKöter\n", encoding="utf-8")
    text = "A man sleeps. A dog runs on the grass."
    out = mtx("translate", "--checkpoint", checkpoint, "--format", "paragraphs", "--beam", "4",
              "--glossary", glossary, input=text + "\n")  # fmt: skip
    first, second = out.stdout.strip().split(". ", 1)
    assert "Köter" in second and "Köter" not in first
    assert "glossary: 1 of 1 terms honoured" in out.stderr


def test_bad_input_is_repaired_and_said_or_refused_in_one_line(checkpoint, tmp_path):
    broken = ["<p>A dog <b>runs", "A man </b> sleeps & dreams.", "<p>Two <i>cats</p>"]
    result = invoke("translate", "--checkpoint", checkpoint, "--format", "html",
                    input="\n".join(broken) + "\n")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "line 1: HTML repaired by the parser" not in result.stdout
    out = [x for x in result.stdout.splitlines() if not x.startswith("line ")]
    for line in out:
        lxml.html.fragment_fromstring(line, create_parent="r")
    said = [x for x in result.stderr.splitlines() if "repaired" in x]
    assert said and all(x.startswith("line ") for x in said)
    for args, message in (
        (("--format", "htm"), "format must be plain, paragraphs, html or xml, got 'htm'"),
        (("--format", "xml", "--set", "decode.placeholders=[re:(]"), "decode.placeholders"),
        (("--format", "html", "--nbest", "2", "--beam", "2"), "no n-best"),
        (("--format", "html", "--alignments"), "alignments are a sentence's"),
        (("--document",), "--document reads the whole input as one text"),
    ):
        result = invoke("translate", "--checkpoint", checkpoint, *args, input="<p>x</p>\n")
        assert result.exit_code != 0 and message in result.output, result.output
        assert "Traceback" not in result.output


def test_corpus_translation_with_broken_lines_resumes_to_the_same_file(checkpoint, tmp_path):
    rng = random.Random(5)
    lines = [f"<p>{tagged(x, rng)}</p>" for x in LINES[:16]]
    lines[3], lines[9] = "<p>A dog <b>runs", "stray </i> & bare"
    source = tmp_path / "in.html"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole, part = tmp_path / "whole.html", tmp_path / "part.html"
    base = ["translate", "--checkpoint", checkpoint, "--format", "html", "--input", source]
    mtx(*base, "--output", whole, "--chunk-lines", "4")
    expected = whole.read_bytes()
    assert len(expected.splitlines()) == len(lines)
    # a run killed after 9 lines and part of the tenth: resumed, the same file
    kept = b"".join(expected.splitlines(keepends=True)[:9]) + expected.splitlines()[9][:7]
    part.write_bytes(kept)
    (tmp_path / "part.html.progress.json").write_bytes(
        (tmp_path / "whole.html.progress.json").read_bytes()
    )
    mtx(*base, "--output", part, "--resume", "--chunk-lines", "4")
    assert part.read_bytes() == expected
    other = invoke(*base[:4], "xml", *base[5:], "--output", part, "--resume")
    assert other.exit_code != 0 and "options.format is 'xml' but" in other.output
    refused = invoke(*base, "--output", tmp_path / "nbest.html", "--nbest", "2", "--beam", "2")
    assert refused.exit_code != 0 and "no n-best" in refused.output
    assert not (tmp_path / "nbest.html").exists()  # nothing begun
    assert not (tmp_path / "nbest.html.progress.json").exists()


@pytest.fixture(scope="module")
def server(checkpoint):
    with Server(checkpoint, "serve.workers=1", "serve.max_chars=2000") as s:
        yield s
        assert s.stop() == 0, "".join(s.lines)


def test_the_server_translates_documents_as_mtx_translate_does(server, checkpoint):
    rng = random.Random(11)
    texts = [f"<p>{tagged(LINES[i], rng)} {LINES[i + 1]}</p>" for i in range(0, 8, 2)]
    texts.append("<p>A dog <b>runs")
    status, answer = server.translate(texts, format="html")
    assert status == 200, answer
    out = subprocess.run(
        [sys.executable, "-m", "mtx", "translate", "--checkpoint", str(checkpoint), "--format",
         "html"], input="\n".join(texts) + "\n", capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert answer["translations"] == out
    assert [r["translation"] for r in answer["results"]] == out
    assert answer["repairs"] and answer["repairs"][0].startswith("text[4]: HTML repaired")
    status, answer = server.translate(f"{LINES[0]} {LINES[1]}", format="paragraphs")
    assert status == 200 and answer["translations"][0].count(".") >= 2
    for options, message in (
        ({"format": "htm"}, "format must be plain, paragraphs, html or xml, got 'htm'"),
        ({"format": "html", "nbest": 2, "beam": 2}, "no n-best"),
        ({"format": "html", "attention": True}, "attention is a sentence's"),
    ):
        status, answer = server.translate("<p>x</p>", **options)
        assert status == 422 and message in answer["error"], answer
    status, answer = server.translate({"text": "<p>x. y.</p>", "prefix": "Ein"}, format="html")
    assert status == 422 and answer["error"].startswith("text: prefix is one sentence's")


def test_the_page_offers_the_formats_and_shows_html_in_a_sandbox(server):
    status, _, page = server.get("/")
    assert status == 200
    assert '<select id="format">' in page and '<option value="html">' in page
    assert 'sandbox=""' in page and "default-src 'none'" in page


def test_a_server_text_in_xml_keeps_its_codes(server):
    text = f'<seg>{LINES[5][:-1]} <x id="1"/> <g id="2">today</g>.</seg>'
    status, answer = server.translate(text, format="xml")
    assert status == 200, answer
    out = etree.fromstring(answer["translations"][0])  # well-formed XML
    assert sorted((e.tag, tuple(e.attrib.items())) for e in out.iter()) == [
        ("g", (("id", "2"),)), ("seg", ()), ("x", (("id", "1"),))
    ]  # fmt: skip
