"""mtx/documents/: sentences, placeholders, marks and their projection, HTML and XML, checked
without a model (a translation is any text with any word links).

The guarantees, for any input and any translation: the output parses, holds every element of
the source once with its attributes, every placeholder as often, and what is not to be
translated byte for byte.
"""

import random
import re
from collections import Counter

import lxml.etree as etree
import lxml.html
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mtx.config import DecodeConfig
from mtx.config.decode import PLACEHOLDERS
from mtx.documents.document import Document, Settings
from mtx.documents.placeholders import KINDS, compile_patterns
from mtx.documents.sentences import split
from mtx.errors import MtxError


def make(fmt: str, lang: str = "en", **changes) -> Settings:
    d = DecodeConfig(format=fmt, **changes)
    return Settings.of(d, lang)


def same(sentence: str) -> tuple[str, list]:
    """A translation that is the sentence, each word aligned to itself."""
    return sentence.upper(), [(i, i) for i in range(len(sentence.split()))]


def reversed_words(sentence: str) -> tuple[str, list]:
    words = sentence.split()
    n = len(words)
    return " ".join(reversed(words)).upper(), [(i, n - 1 - i) for i in range(n)]


def translate(text: str, s: Settings, how=same) -> tuple[Document, str]:
    doc = Document.read(text, s)
    return doc, doc.assemble([how(x) for x in doc.sentences])


def elements(text: str, kind: str) -> Counter:
    """The multiset of (tag, attributes) of a fragment, parsed strictly for XML."""
    if kind == "xml":
        root = etree.fromstring(f"<r>{text}</r>")  # raises on anything ill-formed
        nodes = list(root.iter())[1:]
    else:
        root = lxml.html.fragment_fromstring(text, create_parent="r")
        nodes = list(root.iter())[1:]
    return Counter(
        (n.tag if isinstance(n.tag, str) else "#comment", tuple(sorted(n.attrib.items())))
        for n in nodes
    )


def test_the_config_defaults_name_the_built_in_placeholders():
    assert set(PLACEHOLDERS) == set(KINDS)


def test_sentences_cover_the_text_and_split_per_language():
    text = "Ein Mann fährt Rad.  Zwei Hunde spielen! Er kauft z. B. Brot."
    ranges = split(text, "de")
    assert "".join(text[a:b] for a, b in ranges) == text
    assert [text[a:b].strip() for a, b in ranges] == [
        "Ein Mann fährt Rad.", "Zwei Hunde spielen!", "Er kauft z. B. Brot."
    ]  # fmt: skip
    assert split("", "en") == []
    # a sentence that begins with a number, and what is no such sentence
    for text, n in (("Eine Landschaft. 2 Mädchen sitzen.", 2), ("Am 2. Mai kam er.", 1),
                    ("Es gibt ca. 5 Leute.", 1), ("Nr. 3 ist z. B. 4 wert.", 1)):  # fmt: skip
        assert len(split(text, "de")) == n, text
    assert len(split("One sentence only", "deu_Latn")) == 1


@pytest.mark.parametrize(
    "text, found",
    [
        ("Hello {name}, you have {0} and {{ count }}", ["{name}", "{0}", "{{ count }}"]),
        ("%s of %d, %1$s at %.2f%%", ["%s", "%d", "%1$s", "%.2f", "%%"]),
        ("Run $HOME or ${PATH} for $5", ["$HOME", "${PATH}"]),
        ('Press <x id="1"/> then <ph id="2">x</ph>', ['<x id="1"/>']),
        ("50 % done, 100%", []),
    ],
)
def test_each_kind_of_placeholder_is_found_and_text_is_not(text, found):
    pattern = compile_patterns(list(PLACEHOLDERS))
    assert [m.group() for m in pattern.finditer(text)] == found


@pytest.mark.parametrize(
    "patterns, message",
    [
        (["re:(unclosed"], "is not a regular expression"),
        (["re:x*"], "matches the empty string"),
        (["curly"], "neither one of"),
    ],
)
def test_a_bad_placeholder_pattern_is_refused_in_one_line(patterns, message):
    with pytest.raises(MtxError, match=message) as e:
        make("paragraphs", placeholders=patterns)
    assert "decode.placeholders" in str(e.value) and "\n" not in str(e.value)


def test_what_a_format_cannot_give_is_refused_naming_what_would_give_it():
    """The engine table's refusals (decode/engines.py): a model without one attention (an
    ensemble) or an engine that gives no alignment cannot put marks back."""
    from mtx.decode import engines
    from mtx.decode.controls import Controls
    from mtx.decode.languages import Languages
    from mtx.decode.options import Options
    from mtx.model.capabilities import Capabilities

    one = Languages("one", {}, ("de",), "en", "de")

    def check(d, nbest, attention=False):
        # one checkpoint has one attention and one output matrix; an ensemble neither
        model = Capabilities(attention=attention, output_matrix=attention)
        setup = engines.Setup.of(d, model, one)
        engines.check(Controls(), Options.of(d, nbest=nbest), setup)

    check(DecodeConfig(format="paragraphs", placeholders=[]), 1)  # no marks to put back
    check(DecodeConfig(format="html"), 1, attention=True)
    for d, nbest, message in (
        (DecodeConfig(format="html", beam=2), 2, "no n-best"),
        (DecodeConfig(format="xml", alignments=True), 1, "alignments are a sentence's"),
        (DecodeConfig(format="paragraphs"), 1, "give one checkpoint"),
        (DecodeConfig(format="html", engine="ctranslate2"), 1, "another engine than ctranslate2"),
    ):
        with pytest.raises(MtxError, match=message):
            check(d, nbest, attention=d.engine == "ctranslate2")


def test_a_documents_controls_are_those_of_each_sentence_the_others_refused():
    from mtx.decode import documents
    from mtx.decode.controls import CONTROLS, Controls, Line

    values = {"prefix": "A", "constraints": ("b",), "avoid": ("c",), "alternatives": 2}
    assert set(values) == set(CONTROLS)  # a new control is declared one way or the other
    s = make("paragraphs")
    for name, control in CONTROLS.items():
        line = Line("One. Two.", Controls({name: values[name]}))
        if control.each_sentence:
            read = documents.read([line], s)
            assert [x.item.controls for x in read.sentences] == [line.controls] * 2
        else:
            with pytest.raises(MtxError, match=f"line 1: {name} is one sentence's"):
                documents.read([line], s)


def test_an_unknown_format_is_refused():
    with pytest.raises(MtxError, match="decode.format"):
        Settings.of(DecodeConfig(format="htm"), "en")  # type: ignore[arg-type]


def test_a_paragraph_is_translated_sentence_by_sentence_with_its_spacing():
    s = make("paragraphs")
    text = "  Hello {name}, welcome.  You have %d new messages!\tBye $USER. "
    doc, out = translate(text, s)
    assert doc.sentences == ["Hello, welcome.", "You have new messages!", "Bye."]
    assert out == "  HELLO {name}, WELCOME.  YOU HAVE %d NEW MESSAGES!\tBYE $USER. "
    doc, out = translate(text, s, reversed_words)
    for p in ("{name}", "%d", "$USER"):
        assert out.count(p) == 1
    assert out.startswith("  ") and out.endswith(". ")


def test_a_placeholder_before_an_element_keeps_the_words_apart():
    doc, out = translate("<p>Count %d<b>items</b> now %s</p>", make("html"))
    assert doc.sentences == ["Count items now"]
    assert out == "<p>COUNT %d<b>ITEMS</b> NOW %s</p>"


@pytest.mark.parametrize(
    "text",
    ["<code>x</code> the dog sleeps.", "<svg>x</svg> the dog.", "{name} the dog",
     '<span translate="no">X</span> the dog.', "<p><code>x</code> the dog.</p>"],
)  # fmt: skip
def test_a_kept_element_at_a_lines_start_keeps_its_space_after_it_not_before(text):
    for how in (same, reversed_words):
        doc, out = translate(text, make("html"), how)
        assert not out.startswith(" ") and "  " not in out, out
        assert elements(out, "html") == elements(text, "html")


def test_a_line_without_words_comes_back_as_it_is():
    for fmt, text in (("paragraphs", "  {name} %s "), ("html", "<p> <br> </p>"), ("xml", "")):
        doc, out = translate(text, make(fmt))
        assert doc.sentences == [] and out == text


def test_plain_is_one_sentence_as_it_is():
    doc = Document.read("One. Two {x}.", make("plain"))
    assert doc.sentences == ["One. Two {x}."]
    assert doc.assemble([("Eins. Zwei {x}.", None)]) == "Eins. Zwei {x}."


def test_html_inline_tags_follow_their_words_and_blocks_are_units():
    s = make("html")
    text = "<p>A <b>red</b> car. Two <a href='x'>big <i>dogs</i></a> play.</p><div>Next</div>"
    doc, out = translate(text, s)
    assert doc.sentences == ["A red car.", "Two big dogs play.", "Next"]
    assert out == (
        '<p>A <b>RED</b> CAR. TWO <a href="x">BIG <i>DOGS</i></a> PLAY.</p><div>NEXT</div>'
    )
    _, out = translate(text, s, reversed_words)
    assert out == (
        '<p>CAR. <b>RED</b> A PLAY. <a href="x"><i>DOGS</i> BIG</a> TWO</p><div>NEXT</div>'
    )


def test_a_line_break_ends_a_sentence_unless_an_element_crosses_it():
    doc, out = translate("<p>Anna Smith<br>Main Street 5<br/>Berlin</p>", make("html"))
    assert doc.sentences == ["Anna Smith", "Main Street 5", "Berlin"]
    assert out == "<p>ANNA SMITH<br>MAIN STREET 5<br>BERLIN</p>"
    doc, out = translate("<p>One <b>two<br>three</b> four</p>", make("html"))
    assert doc.sentences == ["One two three four"]  # a break is between words
    assert out == "<p>ONE <b>TWO <br>THREE</b> FOUR</p>"


def test_what_is_not_to_be_translated_is_kept_byte_for_byte():
    s = make("html")
    text = (
        "<p>Run <code>make  test</code> now.</p><pre> keep\n  this </pre>"
        "<script>if (a < b && c) {x()}</script><style>p > b {color: red}</style>"
        '<p translate="no">Do not</p><p class="x notranslate">Nor this</p><p>But this</p>'
    )
    doc, out = translate(text, s, reversed_words)
    assert doc.sentences == ["Run now.", "this But"[::-1][::-1].split()[1] + " this"]
    for kept in (
        "<code>make  test</code>", "<pre> keep\n  this </pre>",
        "<script>if (a < b && c) {x()}</script>", "<style>p > b {color: red}</style>",
        '<p translate="no">Do not</p>', '<p class="x notranslate">Nor this</p>',
    ):  # fmt: skip
        assert kept in out
    assert "<p>THIS BUT</p>" in out


def test_a_whole_html_page_and_an_xml_file_keep_their_doctype_and_declaration():
    page = (
        "<!DOCTYPE html>\n<html><head><title>Hi there</title></head>"
        "<body><h1>Fish &amp; chips</h1><p>One&nbsp;two.</p></body></html>\n"
    )
    doc, out = translate(page, make("html"))
    assert doc.sentences == ["Hi there", "Fish & chips", "One two."]
    assert out.startswith("<!DOCTYPE html>") and "<title>HI THERE</title>" in out
    assert "FISH &amp; CHIPS" in out and out.endswith("</html>\n")
    xml = '<?xml version="1.0" encoding="utf-8"?>\n<doc><seg>Press <g id="1">Save</g>.</seg></doc>'
    doc, out = translate(xml, make("xml"))
    assert out.startswith('<?xml version="1.0" encoding="utf-8"?>')
    assert '<seg>PRESS <g id="1">SAVE</g>.</seg>' in out
    # a page keeps its own doctype, or none: the parser's own is never written
    for page, doctype in (
        ("<html><body><p>the dog.</p></body></html>", ""),
        ("<!DOCTYPE html><p>the dog.</p>", "<!DOCTYPE html>"),
        ("<!doctype html>  <html><body><p>the dog.</p></body></html>", "<!doctype html>  "),
    ):
        doc, out = translate(page, make("html"))
        assert "\n" not in out and out.startswith(doctype + "<html><body><p>THE DOG.</p>"), out
    xml = '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY e "dog">]><r>the &e; sleeps.</r>'
    doc, out = translate(xml, make("xml"))
    assert out == '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY e "dog">]><r>THE DOG SLEEPS.</r>'


XLIFF = (
    '<?xml version="1.0"?><xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
    '<file source-language="en" target-language="de"><body><trans-unit id="1">'
    '<source xml:lang="en">Press <g id="1">Save</g> now.</source><target>old</target>'
    "</trans-unit></body></file></xliff>",
    '<xliff version="2.0" xmlns="urn:oasis:names:tc:xliff:document:2.0" srcLang="en" '
    'trgLang="de"><file id="f"><unit id="u"><segment><source>The dog <pc id="1">sleeps</pc>.'
    "</source></segment></unit></file></xliff>",
)


@pytest.mark.parametrize("text", XLIFF)
def test_an_xliff_file_keeps_its_sources_and_gets_each_target(text):
    doc, out = translate(text, make("xml"))
    root = etree.fromstring(out.split("?>", 1)[-1].encode())
    ns = {"x": root.nsmap[None]}
    source, target = root.find(".//x:source", ns), root.find(".//x:target", ns)
    assert len(root.findall(".//x:target", ns)) == 1  # one there before is replaced
    assert re.search("<source.*</source>", text).group() in out  # the source as it was
    assert (
        source.getnext() is target
        and "{http://www.w3.org/XML/1998/namespace}lang" not in target.attrib
    )
    assert "".join(target.itertext()) == "".join(source.itertext()).upper()
    assert [e.tag for e in target.iter()][1:] == [e.tag for e in source.iter()][1:]
    assert "mtx-source" not in out


def test_xliff_codes_and_elements_in_running_text_are_marks():
    s = make("xml")
    text = '<seg>Press <g id="1">Save</g> to <x id="2"/> go <term>on</term>.</seg>'
    doc, out = translate(text, s, reversed_words)
    assert doc.sentences == ["Press Save to go on."]
    # the full stop the source had after </term> stays after it
    assert out == '<seg><term>ON</term>. <x id="2"/> GO TO <g id="1">SAVE</g> PRESS</seg>'


@pytest.mark.parametrize(
    "text, target, links, expected",
    [
        # a target word that is only punctuation does not widen a span without any
        ("<b>ein Iglu</b> .", "an igloo .", [(0, 0), (1, 1), (1, 2), (2, 2)],
         "<b>an igloo</b> ."),
        # a tag inside a word takes the whole word
        ("fahr<b>e</b> gerne", "I like driving", [(0, 2), (1, 1)], "I like <b>driving</b>"),
        # an unaligned span takes the words at its relative place
        ("a <b>b</b> c d", "w x y z", [(0, 0), (2, 2), (3, 3)], "w <b>x</b> y z"),
        # a nested span that lands outside its parent takes its parent's words
        ("<b>a <i>b</i></b> c d", "x y z w", [(0, 3)], "x y z <b><i>w</i></b>"),
        # crossing siblings: the later starts where the earlier ends, empty if nothing is left
        ("<b>a</b> <i>b</i> c", "x y z", [(0, 0), (0, 1), (1, 1), (2, 2)],
         "<b>x y</b> <i/> z"),
        # a kept mark inside a word goes before the same punctuation
        ("Hello {name}, welcome", "Hallo, willkommen", [(0, 0), (1, 1)],
         "Hallo {name}, willkommen"),
        ("Hello <x/>world", "Hallo Welt", [(0, 0), (1, 1)], "Hallo <x/>Welt"),
        # an unaligned word's kept mark goes by the next aligned word (before), else the last
        ("a %d b c", "x y z", [(0, 0), (2, 2)], "x y %d z"),
        ("a b %d", "x y z", [(0, 0)], "x %d y z"),
    ],
)  # fmt: skip
def test_the_placement_rules(text, target, links, expected):
    doc = Document.read(f"<seg>{text}</seg>", make("xml"))
    out = doc.assemble([(target, links)])
    assert out == f"<seg>{expected}</seg>"


def test_the_parsers_repairs_are_said_and_the_output_parses():
    for kind, text in (
        ("html", "x </b> y & z <p>unclosed <b>bold"),
        ("xml", "a <b>x</b> & y"),
        ("xml", "a <b>x y"),
        ("xml", "</b> stray"),
    ):
        doc, out = translate(text, make(kind), reversed_words)
        assert doc.repairs, text
        assert all("\n" not in r and ("repaired" in r or "dropped" in r) for r in doc.repairs)
        assert not any("mtx-root" in r for r in doc.repairs)  # our wrapper, not the user's
        elements(out, kind)  # parses
    doc = Document.read("<p>fine <b>html</b></p>", make("html"))
    assert doc.repairs == []


WORDS = ["the", "dog", "runs", "a", "red", "ball", "fast", "home", "and", "cat", "sleeps."]
INLINE = [("b", ""), ("i", ""), ("a", ' href="/x?a=1&amp;b=2"'), ("span", ' class="k"'),
          ("em", ' title="t"')]  # fmt: skip
KEPT = ["<br>", "<code>x &lt; y</code>", "{name}", "%1$s", "$HOME", "<!-- note -->"]


@st.composite
def fragments(draw, depth: int = 0):
    """A fragment of running text: words, inline elements (nested), kept marks, sentences."""
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        choice = draw(st.integers(0, 9))
        if choice < 5 or depth > 2:
            parts.append(draw(st.sampled_from(WORDS)))
        elif choice < 8:
            tag, attrs = draw(st.sampled_from(INLINE))
            parts.append(f"<{tag}{attrs}>{draw(fragments(depth + 1))}</{tag}>")
        else:
            parts.append(draw(st.sampled_from(KEPT)))
    glue = draw(st.sampled_from([" ", " ", "", ". "]))
    return glue.join(parts)


@settings(max_examples=150, deadline=None)
@given(
    body=fragments(),
    kind=st.sampled_from(["html", "xml"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_translation_of_any_markup_parses_and_keeps_every_element_and_placeholder(
    body, kind, seed
):
    if kind == "xml":
        body = body.replace("<br>", "<br/>")
    text = f"<p>{body}</p><ul><li>{body}</li></ul>"
    rng = random.Random(seed)

    def anything(sentence: str):
        n, m = len(sentence.split()), rng.randint(0, 8)
        words = [rng.choice(["x", "y,", "z.", "w"]) for _ in range(m)]
        links = [(rng.randrange(n), rng.randrange(m)) for _ in range(rng.randint(0, 2 * n))] \
            if m and n else []  # fmt: skip
        return " ".join(words), links

    doc, out = translate(text, make(kind), anything)
    assert elements(out, kind) == elements(text, kind)
    for p in ("{name}", "%1$s", "$HOME", "x &lt; y", "<!-- note -->"):
        assert out.count(p) == text.count(p), p


BROKEN = ["<b>", "</b>", "</b", "<i", "</i>", "<p>", "<em ", "&", "<", ">", "<!--", "-->", "&amp;"]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(WORDS) | st.sampled_from(BROKEN), max_size=14),
    glue=st.sampled_from([" ", ""]),
    kind=st.sampled_from(["html", "xml"]),
)
def test_no_word_a_user_wrote_vanishes_unreported(parts, glue, kind):
    """Broken markup is repaired by the parser, which may drop text (`the <b>dog</b sleeps.`
    loses "sleeps."): each word written is translated, or said in a repair."""
    text = glue.join(parts)
    doc, out = translate(text, make(kind))
    said = Counter("".join(r.split(": ")[-1] for r in doc.repairs if "dropped" in r))
    kept = Counter("".join(doc.sentences))  # letters: a tag inside a word joins its pieces
    words = re.sub(r"<!--.*?(-->|$)|<[^<>]*>|</?[a-z][^\s<>/]*|&amp;", " ", text)  # tag names
    written = Counter("".join(re.findall(r"\w+", words)))
    assert not written - kept - said, (text, doc.sentences, doc.repairs)


def test_a_repair_that_drops_words_is_said_on_its_line():
    doc, out = translate("the <b>dog</b sleeps.", make("html"))
    assert "1 word(s) the parser's repair dropped: sleeps" in doc.repairs
    doc, out = translate("the <b>dog</b> sleeps.", make("html"))
    assert doc.repairs == []


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(list("<>/&;#!?=\"' abpx-[]\x00\x0b\ud800é{}%$1"))
        | st.characters(),
        max_size=60,
    ),
    kind=st.sampled_from(["html", "xml"]),
)
@example(text="<:", kind="xml")  # the parser's repair names an element ":"
def test_any_text_at_all_is_read_repaired_and_written_back_so_that_it_parses(text, kind):
    doc, out = translate(text, make(kind), reversed_words)
    if kind == "xml":
        etree.fromstring(f"<r>{out}</r>")  # well-formed, whatever came in
    else:
        lxml.html.fragment_fromstring(out, create_parent="r")
    assert all("\n" not in r for r in doc.repairs)
