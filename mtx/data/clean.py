"""Cleaning of parallel text: the rules, each a setting of `data.clean` (or of `data`), each
drop counted by its reason.

Whitespace is stripped and collapsed on every side of every split first. Then each training
pair meets the rules below in this order (the per-pair ones are the table PAIR_RULES), and the first that fires is its reason (a pair is
dropped, and counted, once):

    empty       a side is empty (validation pairs too)
    nontext     a side holds characters that are not text: control characters, U+FFFD (a
                decoding failure), private-use or unassigned code points (clean.nontext)
    markup      a side holds an HTML/XML entity, or tags that do not nest, or the two sides'
                tags differ (clean.markup)
    nonletters  more than clean.max_nonletters of a side's characters (spaces aside) are not
                letters: digits, punctuation, symbols
    copy        the target is the source, or nearly: at least clean.copy of the target's
                normalised words are also the source's (in a multiset)
    numbers     the numbers on one side are not those on the other (clean.numbers; digits of
                every script read as ASCII, "1,000" = "1.000" = "1000")
    langid      a side is identified as another language than the one declared, with at least
                clean.langid probability (py3langid: mtx/data/langid.py)
    duplicate   the pair was met before (data.dedup: true, as is; normalised, after case,
                punctuation and whitespace are normalised)

and, after encoding, `length_reasons`: too_long (over data.max_len subwords) and ratio (over
data.max_ratio). Every rule but `duplicate` looks at one pair alone, so they run in
data.workers processes and the result is the same for any number of them; duplicates are
then found in one pass in order (the first occurrence is kept). The cleaning map takes
BATCH pairs a call, and identifies the languages of a call's pairs together.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH = 1000  # pairs a call of the cleaning map (PairCleaner)

# characters that are not text: control characters (tab and newline are whitespace, gone by
# now), surrogates, private use, unassigned, and U+FFFD (a decoding failure upstream)
_NONTEXT_CATEGORIES = {"Cc", "Cs", "Co", "Cn"}
_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)\b[^<>]*?(/?)>")
_ENTITY = re.compile(r"&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]{1,30});")
_NUMBER = re.compile(r"\d+(?:[.,\u00a0\u202f' ]\d+)*")
_NOT_WORD = re.compile(r"[^\w\s]|_")
_NONLETTER = re.compile(r"[^\w\s]|[\d_]")  # marks too: see nonletter_share
_DIGIT = re.compile(r"\d")


@functools.cache
def _latin1_tables() -> tuple[bytes, bytes, re.Pattern[bytes]]:
    """Byte tables that give `normalise` and `nonletter_share` at C speed on Latin-1 text
    (most European text), built from the regexes above so that they agree with them (tested):
    punctuation -> space; the letters and whitespace (deleted, what is left is non-letters:
    Latin-1 holds no combining marks); and the characters whose NFKC form or case folding
    differ (µ, ², ½, the no-break space, ...; ß, folded to "ss", aside): text with any of them
    takes the slow path."""
    chars = [chr(c) for c in range(256)]
    punctuation = bytes(32 if _NOT_WORD.match(c) else ord(c) for c in chars)
    letters = bytes(i for i, c in enumerate(chars) if not _NONLETTER.match(c))
    unstable = [
        i for i, c in enumerate(chars)
        if unicodedata.normalize("NFKC", c) != c or (c.casefold() != c.lower() and c != "ß")
    ]  # fmt: skip
    return punctuation, letters, re.compile(b"[%s]" % b"".join(b"\\x%02x" % i for i in unstable))


def _latin1(text: str) -> bytes | None:
    """The text as Latin-1 bytes, or None where it holds other characters."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return None


@functools.cache
def _digits() -> dict[int, str]:
    """Every decimal digit of every script -> its ASCII digit (built once, when first needed:
    it takes a fifth of a second)."""
    return {
        c: str(unicodedata.digit(chr(c)))
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) == "Nd"
    }


def collapse(text: str) -> str:
    """Whitespace stripped and collapsed to single spaces (every split, every side)."""
    return " ".join(text.split())


def normalise(text: str) -> str:
    """What two sides or two pairs are compared by: case folded, punctuation and symbols
    removed, whitespace collapsed (NFKC first, so that width and ligature variants agree)."""
    raw = _latin1(text)
    punctuation, _, unstable = _latin1_tables()
    if raw is not None and not unstable.search(raw):  # NFKC is a no-op, casefold is lower
        text = raw.translate(punctuation).decode("latin-1").lower()
        return " ".join((text.replace("ß", "ss") if b"\xdf" in raw else text).split())
    text = unicodedata.normalize("NFKC", text).casefold()  # ASCII took the path above
    return " ".join(_NOT_WORD.sub(" ", text).split())


def has_nontext(text: str) -> bool:
    if "\ufffd" in text:
        return True
    if text.isprintable():  # the fast path: every character is text
        return False
    return any(unicodedata.category(c) in _NONTEXT_CATEGORIES for c in text)


def tags(text: str) -> list[str] | None:
    """The tags of a side as "<b>", "</b>", "<br/>" in order, or None if they do not nest."""
    found, stack = [], []
    for m in _TAG.finditer(text):
        name, closing, empty = m.group(1).lower(), m.group(0).startswith("</"), m.group(2)
        found.append(f"<{'/' if closing else ''}{name}{'/' if empty else ''}>")
        if empty:
            continue
        if closing:
            if not stack or stack.pop() != name:
                return None
        else:
            stack.append(name)
    return None if stack else found


def markup_reason(src: str, tgt: str) -> bool:
    """Whether a pair holds broken markup: an entity (escaped text), tags that do not nest,
    or tags that differ between the sides (the same balanced tags on both sides pass)."""
    if "&" in src + tgt and (_ENTITY.search(src) or _ENTITY.search(tgt)):
        return True
    if "<" not in src + tgt:
        return False
    s, t = tags(src), tags(tgt)
    return s is None or t is None or s != t


def nonletter_share(text: str) -> float:
    """The share of a side's characters, spaces aside, that are not letters (nor marks);
    whitespace is collapsed to single spaces by now."""
    chars = len(text) - text.count(" ")
    if not chars:
        return 0.0
    raw = _latin1(text)
    if raw is not None:  # the letters and spaces deleted, the non-letters are left
        return len(raw.translate(None, _latin1_tables()[1])) / chars
    found = _NONLETTER.findall(text)  # combining marks (Indic vowel signs) are letters' parts:
    return sum(not unicodedata.category(c).startswith("M") for c in found) / chars


def copy_share(src: str, tgt: str) -> float:
    """The share of the target's words that are also the source's (a multiset intersection),
    both sides normalised: 1 for a copy, near 1 for a copy with a few edits."""
    words = tgt.split()
    if not words:
        return 0.0
    source = set(src.split())
    hits = sum(map(source.__contains__, words))
    if hits < 0.5 * len(words):  # the fast path: far from a copy
        return hits / len(words)
    t = Counter(words)
    common = t & Counter(src.split())
    return sum(common.values()) / sum(t.values())


def numbers(text: str) -> Counter[str]:
    """The numbers of a side, each as its ASCII digits without separators."""
    return Counter(
        re.sub(r"\D", "", m.group(0).translate(_digits())).lstrip("0") or "0"
        for m in _NUMBER.finditer(text)
    )


def _nonletters(limit: float, src: str, tgt: str, norm) -> bool:
    return nonletter_share(src) > limit or nonletter_share(tgt) > limit


def _copy(share: float, src: str, tgt: str, norm) -> bool:
    return copy_share(*(norm or (normalise(src), normalise(tgt)))) >= share


def _numbers(on: bool, src: str, tgt: str, norm) -> bool:
    return bool(_DIGIT.search(src) or _DIGIT.search(tgt)) and numbers(src) != numbers(tgt)


@dataclass(frozen=True)
class Rule:
    """A per-pair rule: the reason it gives, its data.clean setting (its default, and the
    value that turns it off) and whether it drops a pair (whitespace collapsed, neither side
    empty; `norm` the pair normalised, or None to compute it if needed)."""

    name: str  # the reason written for the pairs it drops (dropped.tsv, the manifest, the table)
    setting: str  # its key under data.clean
    default: Any  # as config/data.py's CleanConfig declares it (tests/test_filtering.py checks)
    off: Any  # the setting's value that turns the rule off
    fires: Callable[[Any, str, str, tuple[str, str] | None], bool]  # (setting, src, tgt, norm)
    drops: str  # what it drops, in a few words


# The per-pair rules, in the order they meet a pair (the first that fires is its reason): the
# one table that Rules and the order of reasons (data/filtering.py's `order`) read; a rule
# added here runs in prepare at its default (settable once CleanConfig declares its key).
PAIR_RULES: list[Rule] = [
    Rule("nontext", "nontext", True, False,
         lambda on, s, t, n: has_nontext(s) or has_nontext(t),
         "control, replacement, private-use or unassigned characters"),
    Rule("markup", "markup", True, False, lambda on, s, t, n: markup_reason(s, t),
         "HTML entities, tags that do not nest, or different tags on the two sides"),
    Rule("nonletters", "max_nonletters", 0.5, 1.0, _nonletters,
         "a side with more than this share of non-letters (spaces aside)"),
    Rule("copy", "copy", 0.9, 0.0, _copy, "a target that copies the source's words"),
    Rule("numbers", "numbers", True, False, _numbers, "different numbers on the two sides"),
]  # fmt: skip
LANGID_DEFAULT = 0.5  # data.clean.langid's: the rule after PAIR_RULES, batched (langid.py)


class Rules:
    """The per-pair rules of the training split as data.clean sets them: each of PAIR_RULES
    by its setting's name (at its default unless given), then the langid rule (0: off)."""

    def __init__(
        self, src_lang: str = "", tgt_lang: str = "", langid: float = LANGID_DEFAULT, **settings
    ) -> None:
        known = {r.setting for r in PAIR_RULES}
        if set(settings) - known:
            raise TypeError(f"no cleaning rule has the setting(s) {sorted(set(settings) - known)}")
        self.src_lang, self.tgt_lang, self.langid = src_lang, tgt_lang, langid
        self.settings = {r.setting: settings.get(r.setting, r.default) for r in PAIR_RULES}

    @classmethod
    def of(cls, clean, src_lang: str, tgt_lang: str) -> Rules:
        """The rules a `CleanConfig` (data.clean) sets; a rule it declares no setting for
        stays at its default."""
        values = {r.setting: getattr(clean, r.setting, r.default) for r in PAIR_RULES}
        return cls(src_lang, tgt_lang, clean.langid, **values)

    @classmethod
    def off(cls, src_lang: str = "", tgt_lang: str = "") -> Rules:
        """Every rule off."""
        return cls(src_lang, tgt_lang, 0.0, **{r.setting: r.off for r in PAIR_RULES})

    def replace(self, **changes) -> Rules:
        """These rules with some settings (or langid, the languages) changed."""
        values = {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "langid": self.langid}
        return Rules(**(values | self.settings | changes))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rules) and vars(self) == vars(other)

    def reason(self, src: str, tgt: str, lid=None, norm: tuple[str, str] | None = None) -> str:
        """Why the pair (whitespace collapsed, neither side empty) is dropped, or ""; `lid`
        identifies languages (mtx/data/langid.py) when the langid rule is on, `norm` is the
        pair normalised (computed here if not given)."""
        return self.reasons([src], [tgt], lid, [norm])[0]

    def reasons(
        self,
        src: list[str],
        tgt: list[str],
        lid=None,
        norms: list[tuple[str, str] | None] | None = None,
    ) -> list[str]:
        """`reason` of each pair: the rules pair by pair, then the langid rule on the pairs
        that pass them, their sides identified together (the same answers, faster)."""
        norms = norms or [None] * len(src)
        on = [
            (r, self.settings[r.setting]) for r in PAIR_RULES if self.settings[r.setting] != r.off
        ]
        out = [_text_reason(on, s, t, n) for s, t, n in zip(src, tgt, norms)]
        if self.langid and lid is not None:
            rest = [i for i, r in enumerate(out) if not r]
            other_src = lid.others([src[i] for i in rest], self.src_lang, self.langid)
            other_tgt = lid.others([tgt[i] for i in rest], self.tgt_lang, self.langid)
            for i, a, b in zip(rest, other_src, other_tgt):
                out[i] = "langid" if a or b else ""
        return out


def _text_reason(on: list[tuple[Rule, Any]], src: str, tgt: str, norm) -> str:
    """The first of the rules `on` (with their settings) that drops the pair, or ""."""
    for rule, value in on:
        if rule.fires(value, src, tgt, norm):
            return rule.name
    return ""


class PairCleaner:
    """A batched `datasets.map` function (with indices) over raw pairs: whitespace collapsed,
    a `reason` column ("" to keep) from the empty rule and `rules` (None: the empty rule
    alone), a `line` column (the pair's 1-based line in its source) and, with `dedup`
    ("true": the pair as is, "normalised": after `normalise`), a `key` column that
    `Duplicates` compares. It pickles without its language identifier: each worker process
    loads one, itself."""

    def __init__(self, drop_empty: bool, rules: Rules | None, dedup: str = "false") -> None:
        self.drop_empty, self.rules, self.dedup, self.lid = drop_empty, rules, dedup, None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"lid": None}

    def __call__(self, batch: dict[str, list[str]], indices: list[int]) -> dict[str, list]:
        src = [collapse(s) for s in batch["src"]]
        tgt = [collapse(t) for t in batch["tgt"]]
        if self.rules is not None and self.rules.langid and self.lid is None:
            from mtx.data.langid import LanguageId

            self.lid = LanguageId()
        norms = [
            (normalise(s), normalise(t)) if self.dedup == "normalised" else None
            for s, t in zip(src, tgt)
        ]
        reasons = self.reasons(src, tgt, norms)
        out = {"src": src, "tgt": tgt, "reason": reasons, "line": [i + 1 for i in indices]}
        if self.dedup == "false":
            return out
        return out | {"key": [pair_key(*(n or (s, t))) for n, s, t in zip(norms, src, tgt)]}

    def reasons(self, src: list[str], tgt: list[str], norms: list) -> list[str]:
        """Each pair's reason: "empty" (if dropped) for a pair with an empty side, else the
        rules' (all pairs at once: Rules.reasons)."""
        out = ["empty" if self.drop_empty else ""] * len(src)
        full = [i for i, (s, t) in enumerate(zip(src, tgt)) if s and t]
        found = [""] * len(full)
        if self.rules is not None:
            pick = [src[i] for i in full], [tgt[i] for i in full], [norms[i] for i in full]
            found = self.rules.reasons(pick[0], pick[1], self.lid, pick[2])
        for i, reason in zip(full, found):
            out[i] = reason
        return out


KEY_BYTES = 12  # a pair's key


def pair_key(src: str, tgt: str) -> bytes:
    """KEY_BYTES bytes that two pairs share only if they are the same (a blake2b digest)."""
    return hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=KEY_BYTES).digest()


class Duplicates:
    """Which pairs were met before, by their `pair_key`, in the order they are offered (the
    first is kept)."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()

    def seen_before(self, key: bytes) -> bool:
        if key in self.seen:
            return True
        self.seen.add(key)
        return False


LENGTH_REASONS = ("", "too_long", "ratio")  # length_reasons' codes


def length_reasons(src_len: np.ndarray, tgt_len: np.ndarray, max_len: int, max_ratio: float):
    """Why each pair of subword lengths (EOS excluded) is dropped, as an index into
    LENGTH_REASONS (0: kept): too_long over max_len, ratio over max_ratio (0: no limit)."""
    src_len, tgt_len = src_len.astype(np.int64), tgt_len.astype(np.int64)
    longer, shorter = np.maximum(src_len, tgt_len), np.maximum(np.minimum(src_len, tgt_len), 1)
    ratio = longer > max_ratio * shorter if max_ratio > 0 else np.zeros(len(src_len), bool)
    too_long = (src_len > max_len) | (tgt_len > max_len)
    return np.where(too_long, 1, np.where(ratio, 2, 0)).astype(np.int8)
