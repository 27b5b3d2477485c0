"""Words as the model's pieces see them.

SentencePiece marks the first piece of each whitespace-separated word with U+2581 ("▁"), so
the words of a segmented sentence are read from its pieces alone: a piece starting with "▁"
and holding more begins a word; a bare "▁" belongs to no word and makes the next piece begin
one; any other piece continues the word before it (or begins the first). Pieces that are not
text (EOS, language tags, other special ids) belong to no word. On text that SentencePiece
does not normalise into other whitespace, these are exactly the whitespace tokens of the
line, and of the detokenised output.

A model's attention over pieces becomes attention over words (`word_matrix`): a target word's
row is the mean of its pieces' rows, a source word's column the sum of its pieces' columns,
and what falls on pieces that are no word (EOS, a language tag) is the null word's (decode/
align.py links each target word to its best source word, or to none). Piece links become word
links when any piece of the source word is linked to any piece of the target word
(`to_words`: fairseq's, Marian's and awesome-align's rule); word links become piece links
between every piece of the two words (how Garg et al. train on subwords).
"""

from __future__ import annotations

import numpy as np

from mtx.align.links import Link

MARK = "\u2581"


def word_index(pieces: list[str | None]) -> list[int | None]:
    """The word each piece belongs to, from 0 (None: no word; a None piece is not text)."""
    out: list[int | None] = []
    w, pending = -1, True
    for p in pieces:
        if p is None:
            out.append(None)
            pending = True  # a word never runs across a special piece
            continue
        if p.startswith(MARK):
            if p.strip(MARK):
                w, pending = w + 1, False
                out.append(w)
            else:
                pending = True
                out.append(None)
            continue
        if pending:
            w, pending = w + 1, False
        out.append(w)
    return out


def words(pieces: list[str | None]) -> list[str]:
    """The words of the pieces, each the concatenation of its pieces without "▁"."""
    out: list[str] = []
    for p, w in zip(pieces, word_index(pieces)):
        if w is None:
            continue
        if w == len(out):
            out.append("")
        out[w] += p.replace(MARK, "")
    return out


def word_matrix(attention: np.ndarray, src: list[int | None], tgt: list[int | None]) -> np.ndarray:
    """(target words, source words + 1) from a (target pieces, source pieces) attention
    matrix, `src` and `tgt` each piece's word (`word_index`): a target word's row is the mean
    of its pieces' rows, each source word's column the sum of its pieces' columns, and the
    last column the attention on pieces that are no word (EOS, a language tag): the null
    word."""
    n_src = max((w for w in src if w is not None), default=-1) + 1
    n_tgt = max((w for w in tgt if w is not None), default=-1) + 1
    columns = np.zeros((len(src), n_src + 1), dtype=attention.dtype)  # piece -> its word
    columns[np.arange(len(src)), [n_src if w is None else w for w in src]] = 1
    rows = np.zeros((n_tgt, attention.shape[0]), dtype=attention.dtype)  # word -> its pieces
    for j, w in enumerate(tgt[: attention.shape[0]]):
        if w is not None:
            rows[w, j] = 1
    rows /= np.maximum(rows.sum(1, keepdims=True), 1)
    return rows @ attention @ columns


def to_words(links: list[Link], src: list[int | None], tgt: list[int | None]) -> set[Link]:
    """Word links from piece links (source position, target position), `src` and `tgt` each
    piece's word (`word_index`)."""
    return {(src[i], tgt[j]) for i, j in links if src[i] is not None and tgt[j] is not None}  # type: ignore[misc]


def to_pieces(links: set[Link], src: list[int | None], tgt: list[int | None]) -> list[Link]:
    """Piece links (source position, target position), sorted, from word links."""
    src_pieces: dict[int, list[int]] = {}
    tgt_pieces: dict[int, list[int]] = {}
    for k, w in enumerate(src):
        if w is not None:
            src_pieces.setdefault(w, []).append(k)
    for k, w in enumerate(tgt):
        if w is not None:
            tgt_pieces.setdefault(w, []).append(k)
    return sorted(
        (i, j) for a, b in links for i in src_pieces.get(a, ()) for j in tgt_pieces.get(b, ())
    )
