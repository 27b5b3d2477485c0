"""The vocabulary's fixed ids, the same in every SentencePiece model mtx trains (data/vocab.py),
in the model's embedding (its padding row), in batching and in the search; a source line's ids
and the length it is padded to. No torch here: `mtx serve`'s HTTP process counts tokens with
these (serve/front.py)."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

SOURCE_BUCKET = 8


def encode_line(sp, line: str, max_positions: int) -> list[int]:
    """A source line's ids: its SentencePiece pieces (whitespace normalised), cut to what the
    model takes, and EOS."""
    return sp.encode(" ".join(line.split()))[: max_positions - 1] + [EOS_ID]


def padded_length(length: int, limit: int = 1 << 30) -> int:
    """The length a source of `length` tokens is padded to: a multiple of SOURCE_BUCKET, at
    most `limit` (the longest source the model takes)."""
    return min(-(-length // SOURCE_BUCKET) * SOURCE_BUCKET, max(limit, length))
