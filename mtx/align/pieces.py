"""Words as the model's pieces see them.

SentencePiece marks the first piece of each whitespace-separated word with U+2581 ("▁"), so
the words of a segmented sentence are read from its pieces alone: a piece starting with "▁"
and holding more begins a word; a bare "▁" belongs to no word and makes the next piece begin
one; any other piece continues the word before it (or begins the first). Pieces that are not
text (EOS, language tags, other special ids) belong to no word. On text that SentencePiece
does not normalise into other whitespace, these are exactly the whitespace tokens of the
line, and of the detokenised output.

Piece links become word links when any piece of the source word is linked to any piece of the
target word (the rule of fairseq, Marian and awesome-align); word links become piece links
between every piece of the two words (how Garg et al. train on subwords).
"""

from __future__ import annotations

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
