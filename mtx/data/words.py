"""SentencePiece ids of a corpus, each distinct word encoded once.

`mtx prepare` encodes millions of sentences whose words repeat (Zipf): SentencePiece spends
most of its time on words it has segmented thousands of times already. `Words` splits a
batch of sentences at spaces with Arrow, looks each distinct word up in a table of the words
it has met (encoding a new one with SentencePiece once), and gathers every sentence's ids
from that table with numpy: the same ids as `SentencePieceProcessor.encode` on each sentence
(tests/test_words.py), without a Python step per word.

Why the ids are the same: SentencePiece normalises a sentence, turns its spaces into "▁"
word boundaries and segments it with pieces that, in a model trained with its default
split_by_whitespace, hold a "▁" only as their first character, so no piece spans two words
and each word is segmented alone (BPE's merges and the unigram lattice alike: both tested).
`Words` checks both conditions it relies on and, where one does not hold, hands the text to
SentencePiece whole: the model's pieces (any "▁" past a piece's first character, or no "▁" piece at all:
every batch goes whole), and each word's normalised form (a word that normalisation would
split, such as one holding a no-break or ideographic space: its sentences go whole). Every
code point that normalisation changes, and every space, mark and control character, at a
word's start, at its end and alone, is tested to encode as SentencePiece encodes it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sentencepiece as spm

BOUNDARY = "\u2581"  # SentencePiece's word boundary, "▁"


def splits_at_words(sp: spm.SentencePieceProcessor) -> bool:
    """Whether no piece of `sp` can span two words: every piece holds "▁" only as its first
    character, and "▁" itself is a piece (so a word never begins with an unknown piece that
    SentencePiece would merge with the previous word's)."""
    if sp.piece_to_id(BOUNDARY) == sp.unk_id():
        return False
    return all(BOUNDARY not in sp.id_to_piece(i)[1:] for i in range(sp.get_piece_size()))


def _whole(normalised: str) -> bool:
    """Whether a sentence holding a word must be encoded whole: the word's normalised form
    (SentencePiece's "▁" in front) holds a second word boundary."""
    return BOUNDARY in normalised[1:]


class Words:
    """Encodes batches of sentences for one SentencePiece model, remembering the ids of every
    word it has met (a worker's table grows with the corpus's distinct words)."""

    def __init__(self, sp: spm.SentencePieceProcessor, threads: int = 1) -> None:
        self.sp, self.threads = sp, threads
        self.by_words = splits_at_words(sp)
        self.row: dict[str, int] = {}  # word -> its row in the table
        self.whole = np.zeros(0, bool)  # per row: its sentences go to SentencePiece whole
        self.start = np.zeros(1, np.int64)  # row r's ids: self.ids[start[r]:start[r + 1]]
        self.ids = np.zeros(0, np.int32)

    def encode(self, texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(ids of every sentence one after the other, int32; offsets, int64, len(texts) + 1):
        sentence i's ids are ids[offsets[i]:offsets[i + 1]], as sp.encode(texts[i])."""
        if not self.by_words:
            return self._sentences(texts.to_pylist())
        split = pc.split_pattern(texts, " ")
        per_word = pc.dictionary_encode(split.flatten())
        rows = self._rows(per_word.dictionary.to_pylist())[per_word.indices.to_numpy()]
        words_at = split.offsets.to_numpy().astype(np.int64)
        size = self.start[rows + 1] - self.start[rows]
        ends = np.cumsum(size)
        ids = self.ids[
            np.repeat(self.start[rows] - (ends - size), size) + np.arange(ends[-1:].sum())
        ]
        offsets = np.concatenate([[0], ends])[words_at]
        whole = self.whole[rows]
        if whole.any():
            sentence = np.repeat(np.arange(len(texts)), np.diff(words_at))
            ids, offsets = self._splice(texts, ids, offsets, np.unique(sentence[whole]))
        return ids, offsets

    def _rows(self, words: list[str]) -> np.ndarray:
        """The table's row of each word, encoding the words it has not met."""
        new = [w for w in words if w not in self.row]
        if new:
            for w in new:
                self.row[w] = len(self.row)
            flat, offsets = self._sentences(new)
            self.start = np.concatenate([self.start, self.start[-1] + offsets[1:]])
            self.ids = np.concatenate([self.ids, flat])
            flags = [_whole(n) for n in self.sp.normalize(new)]
            self.whole = np.concatenate([self.whole, np.array(flags, bool)])
        return np.fromiter(map(self.row.__getitem__, words), np.int64, len(words))

    def _sentences(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """SentencePiece's ids of each text whole, as `encode` returns them."""
        encoded = self.sp.encode(texts, num_threads=self.threads)
        sizes = np.fromiter(map(len, encoded), np.int64, len(texts))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return np.fromiter((i for e in encoded for i in e), np.int32, int(offsets[-1])), offsets

    def _splice(self, texts, ids, offsets, whole) -> tuple[np.ndarray, np.ndarray]:
        """The ids with sentences `whole` (sorted indices) encoded by SentencePiece whole."""
        new_ids, new_offsets = self._sentences(pc.take(texts, pa.array(whole)).to_pylist())
        sizes = np.diff(offsets)
        sizes[whole] = np.diff(new_offsets)
        keep = np.ones(len(texts), bool)
        keep[whole] = False
        out_offsets = np.concatenate([[0], np.cumsum(sizes)])
        out = np.empty(out_offsets[-1], np.int32)
        kept_at = np.repeat(keep, np.diff(offsets))
        out[np.repeat(keep, sizes)] = ids[kept_at]
        out[~np.repeat(keep, sizes)] = new_ids
        return out, out_offsets
