"""Cleaning of parallel text, reported as counts of what was dropped and why.

Text level (before SentencePiece): strip whitespace, drop pairs with an empty side, optionally
drop exact duplicates. Token level (after encoding, training split only): drop pairs longer than
`max_len` subwords on either side or whose length ratio exceeds `max_ratio`.
"""

from __future__ import annotations

import hashlib
from collections import Counter


class TextCleaner:
    """A batched `datasets.map` function; `counts` says how many pairs each rule dropped."""

    def __init__(self, drop_empty: bool, dedup: bool) -> None:
        self.drop_empty = drop_empty
        self.dedup = dedup
        self.seen: set[bytes] = set()
        self.counts: Counter[str] = Counter()

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {"src": [], "tgt": []}
        for src, tgt in zip(batch["src"], batch["tgt"]):
            self.counts["read"] += 1
            src, tgt = " ".join(src.split()), " ".join(tgt.split())
            if self.drop_empty and (not src or not tgt):
                self.counts["empty"] += 1
                continue
            if self.dedup:
                key = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=12).digest()
                if key in self.seen:
                    self.counts["duplicate"] += 1
                    continue
                self.seen.add(key)
            out["src"].append(src)
            out["tgt"].append(tgt)
        return out


def length_reason(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a pair of subword lengths (EOS excluded) is dropped, or None to keep it."""
    if src_len > max_len or tgt_len > max_len:
        return "too_long"
    if max_ratio > 0 and max(src_len, tgt_len) > max_ratio * max(min(src_len, tgt_len), 1):
        return "ratio"
    return None
