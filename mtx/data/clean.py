"""Cleaning of parallel text, reported as counts of what was dropped and why.

Text level (before SentencePiece): strip whitespace, drop pairs with an empty side, optionally
drop exact duplicates. Token level (after encoding, training split only): drop pairs longer than
`max_len` subwords on either side or whose length ratio exceeds `max_ratio`.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter


class TextCleaner:
    """A batched `datasets.map` function; `counts` says how many pairs each rule dropped and
    `dedup_seconds` how long deduplicating took."""

    def __init__(self, drop_empty: bool, dedup: bool) -> None:
        self.drop_empty = drop_empty
        self.dedup = dedup
        self.seen: set[bytes] = set()
        self.counts: Counter[str] = Counter()
        self.dedup_seconds = 0.0

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[str]]:
        self.counts["read"] += len(batch["src"])
        pairs = [
            (" ".join(s.split()), " ".join(t.split())) for s, t in zip(batch["src"], batch["tgt"])
        ]
        if self.drop_empty:
            kept = [(s, t) for s, t in pairs if s and t]
            self.counts["empty"] += len(pairs) - len(kept)
            pairs = kept
        if self.dedup:
            start = time.perf_counter()
            pairs = [p for p in pairs if self._first(*p)]
            self.dedup_seconds += time.perf_counter() - start
        return {"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}

    def _first(self, src: str, tgt: str) -> bool:
        """Whether the pair is seen for the first time (counting it as a duplicate if not)."""
        key = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=12).digest()
        if key in self.seen:
            self.counts["duplicate"] += 1
            return False
        self.seen.add(key)
        return True


def length_reason(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a pair of subword lengths (EOS excluded) is dropped, or None to keep it."""
    if src_len > max_len or tgt_len > max_len:
        return "too_long"
    if max_ratio > 0 and max(src_len, tgt_len) > max_ratio * max(min(src_len, tgt_len), 1):
        return "ratio"
    return None
