"""Language identification for `mtx prepare`'s langid rule, with py3langid: a naive Bayes
classifier over byte n-grams whose model ships inside the package (works offline), 97
languages and more. Chosen over lingua-language-detector by measurement (BENCHMARKS.md,
"Cleaning noisy corpora"): the same accuracy on Multi30k's short sentences in four languages,
many times as fast, and a package a twentieth of the size.

py3langid finds a text's n-grams by walking an automaton over its bytes, one byte at a time
in Python: most of its time on short sentences. `identify_many` walks a batch of texts in
step, one numpy operation per byte position for all of them, then scores each text with
py3langid's own expression on its own n-gram counts (in the order the walk meets them), so
every answer, probability included, is the one `LanguageIdentifier.classify` gives for that
text alone, whatever else is in the batch (tests/test_clean.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from py3langid.langid import MODEL_FILE, LanguageIdentifier

CELLS = 1 << 21  # texts x byte positions walked at once: memory bounded for long lines
TOGETHER = 16  # fewer texts than this (as long as CELLS allows) go through py3langid itself


def code(lang: str) -> str:
    """The identifier's code of a declared language: "pt_BR" and "pt-BR" -> "pt"."""
    return lang.replace("_", "-").split("-")[0].lower()


class LanguageId:
    """The identifier, loaded once per process (about 0.3 s)."""

    def __init__(self) -> None:
        m = self.model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        self.known = set(m.nb_classes)
        self.nextmove = np.asarray(m.tk_nextmove, dtype=np.int64)  # (row << 8 | byte) -> state
        self.rowbase = np.asarray(m.tk_row, dtype=np.int64) << 8  # state -> its row << 8
        self.output = np.asarray(m.tk_output, dtype=np.int64)  # state -> n-gram id, or -1
        self.ptc = m.nb_ptc.astype(np.float32)  # what float32 @ float16 computes with

    def knows(self, lang: str) -> bool:
        return code(lang) in self.known

    def identify(self, text: str) -> tuple[str, float]:
        """(the most probable language, its probability): py3langid's own classify."""
        lang, prob = self.model.classify(text)
        return lang, float(prob)

    def identify_many(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """`identify` of each text, the texts walked together, shortest first."""
        data = [self.model._encode(t) for t in texts]
        order = sorted(range(len(data)), key=lambda i: len(data[i]))
        out: list[tuple[str, float]] = [("", 0.0)] * len(data)
        start = 0
        while start < len(order):
            end = start + 1  # as many texts as fit CELLS at the longest one's length
            while end < len(order) and (end - start + 1) * len(data[order[end]]) <= CELLS:
                end += 1
            group = order[start:end]
            if len(group) < TOGETHER:  # a few long texts: py3langid walks them faster
                answers = [self.identify(texts[i]) for i in group]
            else:
                answers = self._classify([data[i] for i in group])
            for i, answer in zip(group, answers):
                out[i] = answer
            start = end
        return out

    def _classify(self, data: list[bytes]) -> list[tuple[str, float]]:
        """py3langid's classify of each UTF-8 text of `data`."""
        m, lengths = self.model, np.array([len(b) for b in data], dtype=np.int64)
        texts, grams, counts = self._visits(data, lengths)
        bounds = np.searchsorted(texts, np.arange(len(data) + 1))
        weights = np.log1p(counts.astype(np.float32))
        scores = np.zeros((len(data), len(m.nb_classes)), dtype=np.float32)
        for i in np.flatnonzero(bounds[1:] > bounds[:-1]):  # a text without n-grams: all 0
            a, b = bounds[i], bounds[i + 1]  # py3langid's expression, text by text
            scores[i] = weights[a:b] @ self.ptc[grams[a:b]] + m.nb_pc
        # py3langid's normalisation, row by row: the same float32 operations
        scores *= np.array([1.0 / math.sqrt(n or 1) for n in lengths], np.float32)[:, None]
        np.exp(scores - scores.max(axis=1, keepdims=True), out=scores)
        scores /= scores.sum(axis=1, keepdims=True)
        for i, j in m._alias_pairs:  # aliased labels folded into their first column
            scores[:, i] += scores[:, j]
            scores[:, j] = 0.0
        best = scores.argmax(axis=1)
        return [(m.nb_classes[k], float(scores[i, k])) for i, k in enumerate(best)]

    def _visits(self, data: list[bytes], lengths: np.ndarray) -> tuple[np.ndarray, ...]:
        """(text, n-gram id, count) of every n-gram each text holds, by text, each text's in
        the order the walk meets them first (py3langid's order, which its sums follow)."""
        width = int(lengths.max(initial=0))
        found = self._walk(data, width)  # (texts, width)
        at = np.flatnonzero((np.arange(width) < lengths[:, None]) & (found >= 0))
        keys = at // max(width, 1) * len(self.ptc) + found.ravel()[at]
        uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
        met = np.argsort(first)  # first positions, text by text: by text, then as met
        uniq, counts = uniq[met], counts[met]
        return uniq // len(self.ptc), uniq % len(self.ptc), counts

    def _walk(self, data: list[bytes], width: int) -> np.ndarray:
        """(texts, width) the n-gram each byte position ends (-1: none, or past the text)."""
        pad = np.zeros((width, len(data)), dtype=np.int64)
        for j, b in enumerate(data):
            pad[: len(b), j] = np.frombuffer(b, dtype=np.uint8)
        grams = np.empty((len(data), width), dtype=np.int64)
        state = np.zeros(len(data), dtype=np.int64)
        for p in range(width):
            state = self.nextmove[self.rowbase[state] + pad[p]]
            grams[:, p] = self.output[state]
        return grams

    def other(self, text: str, lang: str, threshold: float) -> bool:
        """Whether `text` is identified as another language than `lang` with at least
        `threshold` probability (never for a language the identifier does not know)."""
        if code(lang) not in self.known:
            return False
        found, prob = self.identify(text)
        return found != code(lang) and prob >= threshold

    def others(self, texts: Sequence[str], lang: str, threshold: float) -> list[bool]:
        """`other` of each text, identified together (`identify_many`)."""
        if code(lang) not in self.known:
            return [False] * len(texts)
        found = self.identify_many(texts)
        return [lang_ != code(lang) and prob >= threshold for lang_, prob in found]
