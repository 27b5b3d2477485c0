"""Sentence splitting with sentencex (Wikimedia's rule-based splitter: about 300 languages,
each falling back to a related one, then English; a compiled core). sentencex and pysbd
split Multi30k's paragraphs alike, sentencex 90 to 480 times faster (BENCHMARKS.md,
"Documents and markup").

A split keeps every character: each sentence carries the whitespace after it, so the
sentences joined give the text back.
"""

from __future__ import annotations

import re

import sentencex

# sentencex does not end a sentence before one that begins with a number ("... Landschaft. 2
# Mädchen sitzen ..."), which would be an ordinal ("am 2. Mai") after a number: a full stop
# after a word of two letters or more that no common abbreviation spells, then a number not
# followed by a full stop, ends one (BENCHMARKS.md, "Documents and markup")
NUMBER_START = re.compile(r"(?<=[^\W\d_])([.!?])(\s+)(?=\d+(?![.\d]))")
ABBREVIATIONS = {"ca", "bzw", "usw", "etc", "vs", "approx", "resp", "inkl", "ggf", "vgl",
                 "evtl", "nr", "no", "fig", "abb", "tel", "str", "min", "max", "bd", "vol"}  # fmt: skip


def split(text: str, lang: str) -> list[tuple[int, int]]:
    """The sentences of `text` as [start, end) character ranges that cover it in order, each
    ending after its trailing whitespace; `lang` the text's language (an ISO code; an NLLB
    code such as deu_Latn is read as its first part)."""
    code = lang.split("_")[0] or "en"
    out, position = [], 0
    for sentence in sentencex.segment(code, text):
        found = text.find(sentence, position)
        if found < 0 or not sentence:  # never seen: a splitter that changed the text
            continue
        if found > position and out:  # whatever it skipped stays with the sentence before
            out[-1] = (out[-1][0], found)
        out.append((position if not out else found, found + len(sentence)))
        position = found + len(sentence)
    if not out:
        return [(0, len(text))] if text else []
    out[-1] = (out[-1][0], len(text))
    return [piece for s, e in out for piece in _before_numbers(text, s, e)]


def _before_numbers(text: str, s: int, e: int) -> list[tuple[int, int]]:
    """[s, e) cut where a sentence ends before one that begins with a number."""
    out = []
    for m in NUMBER_START.finditer(text, s, e):
        word = text[: m.start(1)].rsplit(None, 1)[-1]
        if len(word) >= 2 and word.isalpha() and word.lower() not in ABBREVIATIONS:
            out.append((s, m.end(2)))
            s = m.end(2)
    return [*out, (s, e)]
