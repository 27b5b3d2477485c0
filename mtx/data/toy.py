"""The embedded toy corpus: a synthetic English -> German-like language pair.

Generated from a small grammar with its own lexicon, so the model has to learn what makes
translation hard rather than copying: grammatical gender and case agreement of articles and
adjectives (nominative, accusative, dative), verb-second word order after a fronted adverb,
verb-final subordinate clauses (weil, dass, wenn), dative-before-accusative with "give", and
negation placed after the object. Deterministic by seed; the splits never share a sentence.
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
        en, de = [en_noun], [de_noun]
        if self.rng.random() < 0.4:
            en_adj, de_adj = self.rng.choice(ADJECTIVES)
            en, de = [en_adj] + en, [de_adj + ending] + de
        if definite:
            en = ["the"] + en
        else:
            en = ["an" if en[0][0] in "aeiou" else "a"] + en
        return en, [article] + de

    def clause(self) -> Clause:
        rng = self.rng
        en_subj, de_subj = self.noun_phrase(AGENTS, "nom")
        negate = rng.random() < 0.2
        kind = rng.choices(["intransitive", "transitive", "ditransitive"], [3, 5, 2])[0]
        if kind == "intransitive":
            en_v, en_base, de_v = rng.choice(INTRANSITIVE)
            en_rest, de_middle = [], []
            if rng.random() < 0.5:
                en_p, de_p = rng.choice(PREPOSITIONS)
                en_np, de_np = self.noun_phrase(THINGS, "dat")
                en_rest, de_middle = [en_p] + en_np, [de_p] + de_np
            if negate:
                de_middle = ["nicht"] + de_middle
        elif kind == "transitive":
            en_v, en_base, de_v = rng.choice(TRANSITIVE)
            en_rest, de_middle = self.noun_phrase(AGENTS + THINGS, "acc")
            if negate:
                de_middle = de_middle + ["nicht"]
        else:
            en_v, en_base, de_v = rng.choice(DITRANSITIVE)
            en_obj, de_obj = self.noun_phrase(THINGS, "acc")
            en_to, de_to = self.noun_phrase(AGENTS, "dat")
            en_rest, de_middle = en_obj + ["to"] + en_to, de_to + de_obj
            if negate:
                de_middle = de_middle + ["nicht"]
        en_verb = ["does", "not", en_base] if negate else [en_v]
        return Clause(en_subj + en_verb + en_rest, de_subj, de_v, de_middle)

    def sentence(self) -> tuple[str, str]:
        rng = self.rng
        main = self.clause()
        shape = rng.choices(["plain", "adverb", "because", "that", "when"], [4, 2, 2, 1, 1])[0]
        if shape == "plain":
            en, de = main.en, main.subject + [main.verb] + main.middle
        elif shape == "adverb":  # verb second: the verb moves before the subject
            en_adv, de_adv = rng.choice(ADVERBS)
            en = [en_adv] + main.en
            de = [de_adv, main.verb] + main.subject + main.middle
        else:
            sub = self.clause()
            de_conj = dict(SUBORDINATORS)[shape]
            de_sub = [de_conj] + sub.subject + sub.middle + [sub.verb]  # verb final
            if shape == "because":
                en = main.en + ["because"] + sub.en
                de = main.subject + [main.verb] + main.middle + [","] + de_sub
            elif shape == "that":
                en = ["i", "know", "that"] + sub.en
                de = ["ich", "weiß", ","] + de_sub
            else:  # "when" clause first: the main clause verb comes right after it
                en = ["when"] + sub.en + [","] + main.en
                de = de_sub + [",", main.verb] + main.subject + main.middle
        return _detokenize(en + ["."]), _detokenize(de + ["."])


def _detokenize(words: list[str]) -> str:
    return " ".join(words).replace(" ,", ",").replace(" .", ".")


def generate(seed: int = 1) -> dict[str, list[tuple[str, str]]]:
    """All splits, disjoint, each a list of (english, german) pairs."""
    rng = random.Random(seed)
    grammar = Grammar(rng)
    total = sum(SPLIT_SIZES.values())
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    while len(pairs) < total:
        en, de = grammar.sentence()
        if en not in seen:
            seen.add(en)
            pairs.append((en, de))
    out, start = {}, 0
    for split in ("test", "valid", "train"):
        out[split] = pairs[start : start + SPLIT_SIZES[split]]
        start += SPLIT_SIZES[split]
    return out


def split_pairs(split: str, seed: int = 1) -> list[tuple[str, str]]:
    if split not in SPLIT_SIZES:
        raise ValueError(f"toy corpus has splits {', '.join(SPLITS)}, not {split!r}")
    return generate(seed)[split]


def write_split(split: str, prefix: str | Path, src_lang: str = "en", tgt_lang: str = "de") -> None:
    """Write PREFIX.{src_lang} and PREFIX.{tgt_lang} for one split."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    pairs = split_pairs(split)
    atomic_write_text(f"{prefix}.{src_lang}", "".join(en + "\n" for en, _ in pairs))
    atomic_write_text(f"{prefix}.{tgt_lang}", "".join(de + "\n" for _, de in pairs))
