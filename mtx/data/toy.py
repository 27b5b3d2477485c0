"""The embedded toy corpus: a synthetic English -> German-like language pair.

Generated from a small grammar with its own lexicon, so the model has to learn what makes
translation hard rather than copying: grammatical gender and case agreement of articles and
adjectives (nominative, accusative, dative), verb-second word order after a fronted adverb,
verb-final subordinate clauses (weil, dass, wenn), dative-before-accusative with "give", and
negation placed after the object. Deterministic by seed; the splits never share a sentence.

The generator also says which English word each German word translates (`alignments`): every
word is made as a `Word` that remembers the English word it comes from, and a pair's links are
read off before the words are joined (punctuation, which attaches to the word before it, is not
linked; "does" and "to", which German does not spell out, are linked to nothing). These are
the gold alignments guided training is tested against (tests/test_guided_alignment.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from mtx.files import atomic_write_text

# noun: (english, german, gender)
AGENTS = [
    ("dog", "hund", "m"),
    ("cat", "katze", "f"),
    ("child", "kind", "n"),
    ("man", "mann", "m"),
    ("woman", "frau", "f"),
    ("girl", "mädchen", "n"),
    ("boy", "junge", "m"),
    ("bird", "vogel", "m"),
    ("horse", "pferd", "n"),
    ("teacher", "lehrer", "m"),
    ("doctor", "ärztin", "f"),
    ("farmer", "bauer", "m"),
    ("student", "studentin", "f"),
    ("mouse", "maus", "f"),
    ("friend", "freund", "m"),
    ("baby", "baby", "n"),
]
THINGS = [
    ("ball", "ball", "m"),
    ("book", "buch", "n"),
    ("apple", "apfel", "m"),
    ("car", "auto", "n"),
    ("letter", "brief", "m"),
    ("flower", "blume", "f"),
    ("table", "tisch", "m"),
    ("house", "haus", "n"),
    ("bread", "brot", "n"),
    ("picture", "bild", "n"),
    ("key", "schlüssel", "m"),
    ("cup", "tasse", "f"),
    ("door", "tür", "f"),
    ("bottle", "flasche", "f"),
]
ADJECTIVES = [
    ("small", "klein"),
    ("big", "groß"),
    ("red", "rot"),
    ("old", "alt"),
    ("young", "jung"),
    ("new", "neu"),
    ("green", "grün"),
    ("happy", "glücklich"),
    ("black", "schwarz"),
    ("white", "weiß"),
    ("fast", "schnell"),
    ("beautiful", "schön"),
]
# verb: (english 3rd singular, english base form, german 3rd singular)
INTRANSITIVE = [
    ("sleeps", "sleep", "schläft"),
    ("laughs", "laugh", "lacht"),
    ("runs", "run", "läuft"),
    ("waits", "wait", "wartet"),
    ("sings", "sing", "singt"),
    ("plays", "play", "spielt"),
]
TRANSITIVE = [
    ("sees", "see", "sieht"),
    ("finds", "find", "findet"),
    ("buys", "buy", "kauft"),
    ("holds", "hold", "hält"),
    ("likes", "like", "mag"),
    ("carries", "carry", "trägt"),
    ("paints", "paint", "malt"),
    ("needs", "need", "braucht"),
    ("knows", "know", "kennt"),
]
DITRANSITIVE = [  # english "X gives the book to the child" -> german dative before accusative
    ("gives", "give", "gibt"),
    ("shows", "show", "zeigt"),
    ("sends", "send", "schickt"),
    ("brings", "bring", "bringt"),
]
PREPOSITIONS = [("with", "mit"), ("near", "bei"), ("in", "in"), ("from", "von")]  # + dative
ADVERBS = [("today", "heute"), ("now", "jetzt"), ("often", "oft"), ("tomorrow", "morgen")]
SUBORDINATORS = [("because", "weil"), ("that", "dass"), ("when", "wenn")]

# (article, adjective ending) by case and gender
DEFINITE = {
    "nom": {"m": ("der", "e"), "f": ("die", "e"), "n": ("das", "e")},
    "acc": {"m": ("den", "en"), "f": ("die", "e"), "n": ("das", "e")},
    "dat": {"m": ("dem", "en"), "f": ("der", "en"), "n": ("dem", "en")},
}
INDEFINITE = {
    "nom": {"m": ("ein", "er"), "f": ("eine", "e"), "n": ("ein", "es")},
    "acc": {"m": ("einen", "en"), "f": ("eine", "e"), "n": ("ein", "es")},
    "dat": {"m": ("einem", "en"), "f": ("einer", "en"), "n": ("einem", "en")},
}

SPLIT_SIZES = {"train": 12000, "valid": 500, "test": 500}
SPLITS = tuple(SPLIT_SIZES)


class Word(str):
    """A word with the English word it translates (`source`; None for an English word, and
    for German words without one)."""

    source: Word | None

    def __new__(cls, text: str, source: Word | None = None) -> Word:
        word = super().__new__(cls, text)
        word.source = source
        return word


def _en(text: str) -> Word:
    return Word(text)


def _pair(en: str, de: str) -> tuple[Word, Word]:
    """An English word and the German word that translates it."""
    word = Word(en)
    return word, Word(de, word)


@dataclass
class Clause:
    """One clause in both languages, German given as its parts so it can be reordered."""

    en: list[str]
    subject: list[str]
    verb: str
    middle: list[str]  # objects, negation and prepositional phrase, in German order


class Grammar:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def noun_phrase(self, nouns: list, case: str) -> tuple[list[str], list[str]]:
        en_noun, de_noun, gender = self.rng.choice(nouns)
        definite = self.rng.random() < 0.6
        article, ending = (DEFINITE if definite else INDEFINITE)[case][gender]
        noun = _pair(en_noun, de_noun)
        en, de = [noun[0]], [noun[1]]
        if self.rng.random() < 0.4:
            en_adj, de_adj = self.rng.choice(ADJECTIVES)
            adj = _pair(en_adj, de_adj + ending)
            en, de = [adj[0]] + en, [adj[1]] + de
        if definite:
            the = _pair("the", article)
        else:
            the = _pair("an" if en[0][0] in "aeiou" else "a", article)
        return [the[0]] + en, [the[1]] + de

    def clause(self) -> Clause:
        rng = self.rng
        en_subj, de_subj = self.noun_phrase(AGENTS, "nom")
        negate = rng.random() < 0.2
        kind = rng.choices(["intransitive", "transitive", "ditransitive"], [3, 5, 2])[0]
        not_en, nicht = _pair("not", "nicht")
        if kind == "intransitive":
            en_v, en_base, de_v = rng.choice(INTRANSITIVE)
            en_rest, de_middle = [], []
            if rng.random() < 0.5:
                en_p, de_p = _pair(*rng.choice(PREPOSITIONS))
                en_np, de_np = self.noun_phrase(THINGS, "dat")
                en_rest, de_middle = [en_p] + en_np, [de_p] + de_np
            if negate:
                de_middle = [nicht] + de_middle
        elif kind == "transitive":
            en_v, en_base, de_v = rng.choice(TRANSITIVE)
            en_rest, de_middle = self.noun_phrase(AGENTS + THINGS, "acc")
            if negate:
                de_middle = de_middle + [nicht]
        else:
            en_v, en_base, de_v = rng.choice(DITRANSITIVE)
            en_obj, de_obj = self.noun_phrase(THINGS, "acc")
            en_to, de_to = self.noun_phrase(AGENTS, "dat")
            en_rest, de_middle = en_obj + [_en("to")] + en_to, de_to + de_obj
            if negate:
                de_middle = de_middle + [nicht]
        verb, de_verb = _pair(en_base if negate else en_v, de_v)
        en_verb = [_en("does"), not_en, verb] if negate else [verb]
        return Clause(en_subj + en_verb + en_rest, de_subj, de_verb, de_middle)

    def sentence(self) -> tuple[str, str, frozenset[tuple[int, int]]]:
        """(english, german, links): the links as (english word, german word) indices of
        the whitespace tokens, from 0."""
        rng = self.rng
        main = self.clause()
        shape = rng.choices(["plain", "adverb", "because", "that", "when"], [4, 2, 2, 1, 1])[0]
        comma, stop = _en(","), _en(".")
        if shape == "plain":
            en, de = main.en, main.subject + [main.verb] + main.middle
        elif shape == "adverb":  # verb second: the verb moves before the subject
            en_adv, de_adv = _pair(*rng.choice(ADVERBS))
            en = [en_adv] + main.en
            de = [de_adv, main.verb] + main.subject + main.middle
        else:
            sub = self.clause()
            en_conj, de_conj = _pair(shape, dict(SUBORDINATORS)[shape])
            de_sub = [de_conj] + sub.subject + sub.middle + [sub.verb]  # verb final
            if shape == "because":
                en = main.en + [en_conj] + sub.en
                de = main.subject + [main.verb] + main.middle + [comma] + de_sub
            elif shape == "that":
                (i, ich), (know, weiss) = _pair("i", "ich"), _pair("know", "weiß")
                en = [i, know, en_conj] + sub.en
                de = [ich, weiss, comma] + de_sub
            else:  # "when" clause first: the main clause verb comes right after it
                en = [en_conj] + sub.en + [comma] + main.en
                de = de_sub + [comma, main.verb] + main.subject + main.middle
        en, de = en + [stop], de + [stop]
        return _detokenize(en), _detokenize(de), _links(en, de)


def _detokenize(words: list[str]) -> str:
    return " ".join(words).replace(" ,", ",").replace(" .", ".")


def _word_numbers(words: list[str]) -> list[int]:
    """Each token's whitespace word once joined: "," and "." join the word before them."""
    out, n = [], -1
    for w in words:
        n += w not in (",", ".")
        out.append(n)
    return out


def _links(en: list[Word], de: list[Word]) -> frozenset[tuple[int, int]]:
    en_word, de_word = _word_numbers(en), _word_numbers(de)
    where = {id(w): en_word[k] for k, w in enumerate(en)}
    return frozenset(
        (where[id(w.source)], de_word[k]) for k, w in enumerate(de) if w.source is not None
    )


def generate(seed: int = 1, links: bool = False) -> dict[str, list]:
    """All splits, disjoint, each a list of (english, german) pairs (with `links`, of
    (english, german, links) triples)."""
    rng = random.Random(seed)
    grammar = Grammar(rng)
    total = sum(SPLIT_SIZES.values())
    seen: set[str] = set()
    pairs: list[tuple] = []
    while len(pairs) < total:
        en, de, aligned = grammar.sentence()
        if en not in seen:
            seen.add(en)
            pairs.append((en, de, aligned) if links else (en, de))
    out, start = {}, 0
    for split in ("test", "valid", "train"):
        out[split] = pairs[start : start + SPLIT_SIZES[split]]
        start += SPLIT_SIZES[split]
    return out


def split_pairs(split: str, seed: int = 1) -> list[tuple[str, str]]:
    if split not in SPLIT_SIZES:
        raise ValueError(f"toy corpus has splits {', '.join(SPLITS)}, not {split!r}")
    return generate(seed)[split]


def alignments(split: str, seed: int = 1) -> list[frozenset[tuple[int, int]]]:
    """The gold word links of each pair of a split, (english word, german word) from 0."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"toy corpus has splits {', '.join(SPLITS)}, not {split!r}")
    return [links for _, _, links in generate(seed, links=True)[split]]


def write_split(split: str, prefix: str | Path, src_lang: str = "en", tgt_lang: str = "de") -> None:
    """Write PREFIX.{src_lang} and PREFIX.{tgt_lang} for one split."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    pairs = split_pairs(split)
    atomic_write_text(f"{prefix}.{src_lang}", "".join(en + "\n" for en, _ in pairs))
    atomic_write_text(f"{prefix}.{tgt_lang}", "".join(de + "\n" for _, de in pairs))
