"""The cleaning rules of mtx/data/clean.py, each on pairs made for it, and the language
identifier of mtx/data/langid.py."""

from __future__ import annotations

import random
import re
import unicodedata

import numpy as np
import pytest
from conftest import MULTI30K
from hypothesis import given, settings
from hypothesis import strategies as st

from mtx.data.clean import (
    LENGTH_REASONS,
    Duplicates,
    PairCleaner,
    Rules,
    copy_share,
    has_nontext,
    length_reasons,
    markup_reason,
    nonletter_share,
    normalise,
    numbers,
    pair_key,
)
from mtx.data.langid import TOGETHER, LanguageId, code

OFF = Rules.off("en", "de")
CLEAN = ("A man rides a red bike down the street.", "Ein Mann fährt mit einem roten Fahrrad die Straße hinunter.")  # fmt: skip


def only(**on) -> Rules:
    """The rules with only those named on."""
    return OFF.replace(**on)


_LID = LanguageId()  # loaded once (about 0.3 s): hypothesis's examples share it


@pytest.fixture(scope="module")
def lid():
    return _LID


def test_a_clean_pair_passes_every_rule(lid):
    assert Rules(src_lang="en", tgt_lang="de").reason(*CLEAN, lid) == ""


@pytest.mark.parametrize(
    "src, tgt",
    [
        ("A dog \ufffd runs.", "Ein Hund läuft."),  # a decoding failure
        ("A dog runs.", "Ein Hund\x07 läuft."),  # a control character
        ("A dog runs.", "Ein Hund \ue000 läuft."),  # private use
        ("A dog runs.", "Ein Hund \U000e0080 läuft."),  # unassigned
    ],
)
def test_characters_that_are_not_text_are_dropped(src, tgt):
    assert only(nontext=True).reason(src, tgt) == "nontext"
    assert only().reason(src, tgt) == ""


def test_text_with_joiners_accents_and_other_scripts_is_text():
    for text in ("Café naïve", "हिन्दी भाषा", "👨\u200d👩\u200d👧", "日本語の文。", "Straße"):
        assert not has_nontext(text), text


@pytest.mark.parametrize(
    "src, tgt, broken",
    [
        ("Stone &amp; tile.", "Stein und Fliesen.", True),  # escaped text
        ("A&#39;s dog.", "Ein Hund.", True),
        ("<b>A dog.", "<b>Ein Hund.", True),  # not closed
        ("A dog.</b>", "Ein Hund.</b>", True),  # not opened
        ("<b>A dog.</b>", "Ein Hund.", True),  # on one side only
        ("<b><i>A</b></i>", "<b><i>Ein</b></i>", True),  # do not nest
        ("<b>A dog.</b>", "<b>Ein Hund.</b>", False),  # the same balanced tags: kept
        ("A <br/> dog.", "Ein <br/> Hund.", False),
        ("1 < 2 and 3 > 2", "1 < 2 und 3 > 2", False),  # not tags
        ("Tom & Jerry", "Tom & Jerry", False),  # not an entity
    ],
)
def test_markup_that_is_broken_is_dropped(src, tgt, broken):
    assert markup_reason(src, tgt) is broken
    assert only(markup=True).reason(src, tgt) == ("markup" if broken else "")


def test_a_side_of_mostly_non_letters_is_dropped():
    assert nonletter_share("A man.") == pytest.approx(1 / 5)
    assert nonletter_share("1, 2, 3 ... 4!") == 1.0
    assert nonletter_share("हिन्दी भाषा") == 0.0  # vowel signs are marks: part of letters
    rules = only(max_nonletters=0.5)
    assert rules.reason("A man.", "Ein Mann.") == ""
    assert rules.reason("Results: 10-2, 3-1 (45%)", "Ergebnisse: 10-2, 3-1 (45%)") == "nonletters"
    assert rules.reason("Front stroke swimming race.", "@@") == "nonletters"


# Latin-1 (the byte-table path: ß, µ, ², ½ and the no-break space among it) and characters
# beyond it (the regex path): combining marks, Greek, CJK, a ligature, fullwidth forms
OTHERS = st.sampled_from("\u0301\u093fπΣ中ﬁＡ１！")
TEXT = st.lists(st.characters(max_codepoint=255) | OTHERS | OTHERS).map("".join)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_the_fast_paths_equal_the_definitions(text):
    """normalise and nonletter_share equal their definitions on any text: NFKC, case folding,
    punctuation and symbols removed, whitespace collapsed; the share of a side's characters,
    spaces aside, that are neither letters, marks nor whitespace."""
    text = " ".join(text.split())  # as the rules meet it: whitespace collapsed
    folded = unicodedata.normalize("NFKC", text).casefold()
    assert normalise(text) == " ".join(re.sub(r"[^\w\s]|_", " ", folded).split())
    chars = len(text) - text.count(" ")
    others = [c for c in text if not (c.isspace() or re.match(r"[^\W\d_]", c))]
    others = [c for c in others if not unicodedata.category(c).startswith("M")]
    assert nonletter_share(text) == pytest.approx(len(others) / chars if chars else 0.0)


@pytest.mark.parametrize(
    "tgt, copied",
    [
        ("A man rides a red bike down the street.", True),  # as is
        ("A MAN RIDES A RED BIKE DOWN THE STREET !", True),  # case and punctuation
        ("A man rides a blue bike down the street.", True),  # 8 of 9 words: nearly
        ("Ein Mann fährt mit einem roten Fahrrad die Straße hinunter.", False),
        ("a a a a a a a a a", False),  # a multiset: one "a" of the source is not nine
    ],
)
def test_a_target_that_copies_the_source_is_dropped(tgt, copied):
    src = CLEAN[0]
    assert (copy_share(normalise(src), normalise(tgt)) >= 0.85) is copied
    assert only(copy=0.85).reason(src, tgt) == ("copy" if copied else "")


def test_numbers_must_match_in_any_script_and_notation():
    assert numbers("1,000 and 3.5 or 007") == numbers("1.000 und 3,5 oder 7")
    assert numbers("٣ dogs") == numbers("3 Hunde")  # Arabic-Indic digits
    rules = only(numbers=True)
    assert rules.reason("Two dogs.", "Zwei Hunde.") == ""
    assert rules.reason("In 1999, 2 dogs.", "1999 zwei Hunde.") == "numbers"
    assert rules.reason("Call 555-1234.", "Rufen Sie 555-1243 an.") == "numbers"
    assert rules.reason("Room 12.", "Zimmer 12.") == ""


def test_language_identification_drops_the_other_language(lid):
    rules = only(langid=0.5)
    assert rules.reason(*CLEAN, lid) == ""
    french = "Un homme fait du vélo rouge dans la rue."
    assert rules.reason(CLEAN[0], french, lid) == "langid"  # target not German
    assert rules.reason(french, CLEAN[1], lid) == "langid"  # source not English
    assert only(langid=0.5, src_lang="xx", tgt_lang="de").reason(french, CLEAN[1], lid) == ""
    assert lid.identify(french)[0] == "fr"
    assert code("pt_BR") == code("pt-BR") == "pt" and lid.knows("pt_BR")
    assert not lid.knows("xx")


OTHERS = [
    "Un homme fait du vélo rouge dans la rue.",  # French
    "Muž jede na červeném kole po ulici.",  # Czech
    "Un hombre monta una bicicleta roja por la calle.",  # Spanish
    "Мужчина едет на красном велосипеде по улице.",  # Russian
    "一个男人在街上骑着一辆红色自行车。",  # Chinese
    "رجل يركب دراجة حمراء في الشارع.",  # Arabic
    "",
    "12345",
    "ÄÖÜ",
    "A DOG RUNS.",
    "<b>",
    "\x00\x07",
    "\ufffd\ufffd",
    "ß" * 3000,
    "Ein Hund " * 400,  # long: with "ß" * 3000, too few such to walk together (py3langid's)
]


def test_identifying_together_gives_py3langids_answers_bit_for_bit(lid):
    lines = OTHERS + [line for name in ("test2016.en", "test2016.de")
                      for line in (MULTI30K / name).read_text(encoding="utf-8").splitlines()]  # fmt: skip
    alone = [lid.model.classify(line) for line in lines]  # py3langid itself
    assert [(lang, float(p)) for lang, p in alone] == lid.identify_many(lines)
    found = {lang for lang, _ in alone[:6]}  # six languages, neither English nor German
    assert len(found) == 6 and not found & {"en", "de"}
    # whatever else is in the batch, in whatever order: the same answers
    picked = random.Random(0).sample(range(len(lines)), 300)
    assert lid.identify_many([lines[i] for i in picked]) == [alone[i] for i in picked]
    assert lid.identify_many([]) == []
    # long lines walked together: 20 of 3,000 bytes or so, English and German mixed
    long = [" ".join(lines[i : i + 30]) for i in range(len(OTHERS), len(lines) - 30, 100)][:20]
    assert len(long) == 20 >= TOGETHER
    assert lid.identify_many(long) == [lid.identify(line) for line in long]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=80), min_size=TOGETHER, max_size=60))  # walked together
def test_identifying_together_equals_one_by_one_on_any_text(texts):
    lid = _LID
    assert lid.identify_many(texts) == [lid.identify(t) for t in texts]


def test_the_langid_rule_batched_drops_what_it_drops_pair_by_pair(lid):
    rules = Rules(src_lang="en", tgt_lang="de")
    src = [CLEAN[0], OTHERS[0], CLEAN[0], "A dog \ufffd.", CLEAN[0], OTHERS[1]]
    tgt = [CLEAN[1], CLEAN[1], OTHERS[2], "Ein Hund.", CLEAN[0], OTHERS[3]]
    one_by_one = [rules.reason(s, t, lid) for s, t in zip(src, tgt)]
    assert one_by_one == ["", "langid", "langid", "nontext", "copy", "langid"]
    assert rules.reasons(src, tgt, lid) == one_by_one
    assert only(langid=0.5, src_lang="xx", tgt_lang="de").reasons(src, tgt, lid)[1] == ""


def test_the_first_rule_that_fires_is_the_reason(lid):
    # nontext, markup and copy all hold: the first in the documented order is given
    pair = ("<b>A dog \ufffd.", "<b>A dog \ufffd.")
    assert Rules(src_lang="en", tgt_lang="de").reason(*pair, lid) == "nontext"
    assert Rules(nontext=False, src_lang="en", tgt_lang="de").reason(*pair, lid) == "markup"
    assert OFF.reason(*pair, lid) == ""


def test_the_cleaner_collapses_whitespace_numbers_lines_and_keys_duplicates():
    cleaner = PairCleaner(True, OFF, "normalised")
    batch = {"src": ["  a  b ", "", "A B!"], "tgt": ["c\td", "x", "C D"]}
    out = cleaner(batch, [10, 11, 12])
    assert out["src"] == ["a b", "", "A B!"] and out["tgt"] == ["c d", "x", "C D"]
    assert out["reason"] == ["", "empty", ""]
    assert out["line"] == [11, 12, 13]
    assert out["key"][0] == out["key"][2] == pair_key("a b", "c d")
    exact = PairCleaner(True, None, "true")(batch, [0, 1, 2])
    assert exact["key"][0] != exact["key"][2]  # as is, they differ
    assert "key" not in PairCleaner(True, None, "false")(batch, [0, 1, 2])
    dup = Duplicates()
    assert [dup.seen_before(k) for k in out["key"]] == [False, False, True]


def test_the_test_split_cleaner_drops_nothing():
    out = PairCleaner(False, None)({"src": ["", "a"], "tgt": ["x", ""]}, [0, 1])
    assert out["reason"] == ["", ""]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=40),
    st.integers(0, 10),
    st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0]),
)
def test_length_rules_drop_over_long_pairs_first_then_extreme_ratios(lens, max_len, max_ratio):
    def why(s: int, t: int) -> str:  # the rules as data.max_len and data.max_ratio say them
        if s > max_len or t > max_len:
            return "too_long"
        if max_ratio and max(s, t) > max_ratio * max(min(s, t), 1):
            return "ratio"
        return ""

    src, tgt = (np.array([p[i] for p in lens], dtype=np.int32) for i in (0, 1))
    codes = length_reasons(src, tgt, max_len, max_ratio)
    assert [LENGTH_REASONS[c] for c in codes] == [why(s, t) for s, t in lens]
