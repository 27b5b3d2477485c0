"""The vocabulary's fixed ids, the same in every SentencePiece model mtx trains (data/vocab.py),
in the model's embedding (its padding row), in batching and in the search; a source line's ids;
the lengths batches and sources are padded to. No torch here: `mtx serve`'s HTTP process counts
tokens with these (serve/front.py), and the config checks that the longest padded pair fits
the model (config.py)."""

from dataclasses import dataclass

import numpy as np

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass(frozen=True)
class Specials:
    """What a vocabulary's special ids mean to the decoder (PAD, UNK and EOS are always 0, 1
    and 3; an imported vocabulary is permuted onto them): the token the decoder starts from,
    and how many ids from 0 up no output contains."""

    start: int
    never_below: int


# model.decoder_start: bos (mtx's own: id 2 is BOS, the start); pad (MarianMT: no BOS, id 2 is
# a piece, the decoder starts from PAD); eos (fairseq and NLLB: starts from EOS, BOS unused)
SPECIALS = {"bos": Specials(BOS_ID, 3), "pad": Specials(PAD_ID, 2), "eos": Specials(EOS_ID, 3)}

SOURCE_BUCKET = 8


def encode_line(sp, line: str, max_positions: int, prefix: list[int] | None = None) -> list[int]:
    """A source line's ids: `prefix` (a target-language tag), its SentencePiece pieces
    (whitespace normalised), cut to what the model takes, and EOS."""
    prefix = prefix or []
    return prefix + sp.encode(" ".join(line.split()))[: max_positions - 1 - len(prefix)] + [EOS_ID]


def longest_output(src_len: int, a: float, b: int, limit: int) -> int:
    """The longest output, EOS included, of a source of `src_len` tokens (EOS excluded):
    a * src_len + b in float32, at least 1 and at most `limit`; decode/rules.py's
    `max_lengths` (the rule) for one sentence, here without torch for the server's process."""
    length = np.float32(a) * np.float32(src_len) + np.float32(b)
    return max(1, min(int(length), limit))


def padded_length(length: int, limit: int = 1 << 30) -> int:
    """The length a source of `length` tokens is padded to: a multiple of SOURCE_BUCKET, at
    most `limit` (the longest source the model takes)."""
    return min(-(-length // SOURCE_BUCKET) * SOURCE_BUCKET, max(limit, length))


def bucket_length(n, pad_to: int = 1):
    """n (an int or an integer array) rounded up to a multiple of its step: 1 below 16, then
    the largest power of two that is at most n / 8, capped at `pad_to` (1: n itself)."""
    x = np.asarray(n, dtype=np.int64)
    if pad_to <= 1:
        return n
    step = np.minimum(pad_to, 2 ** np.maximum(0, np.floor(np.log2(np.maximum(x, 1))) - 3))
    out = -(-x // step.astype(np.int64)) * step.astype(np.int64)
    return int(out) if out.ndim == 0 else out
