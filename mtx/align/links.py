"""Alignment files: Pharaoh links and gold links with sure and possible ones.

Pharaoh (Moses, fast_align, eflomal, fairseq, Marian): one line per sentence pair, `i-j` pairs
separated by spaces, i a 0-based source word index and j a 0-based target word index; words
are whitespace tokens. An empty line: no link.

Gold files (the RWTH German-English set's `.talp`): `i-j` a sure link, `ipj` a possible one,
counted from 1 (`one_based`), as in shared data; a sure link is also possible.

Every reader refuses, in one line naming the file and line, a malformed link, a link out of
range of its sentence's words, and a file with more or fewer lines than the corpus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from mtx.errors import MtxError

Link = tuple[int, int]
_LINK = re.compile(r"^(\d+)([-p])(\d+)$")


def format_links(links: Iterable[Link]) -> str:
    """Pharaoh text of `links`, sorted by source then target index: `0-0 1-2`."""
    return " ".join(f"{i}-{j}" for i, j in sorted(set(links)))


def parse_links(
    line: str, where: str, lengths: tuple[int, int] | None = None, gold: bool = False,
    one_based: bool = False,
) -> tuple[set[Link], set[Link]]:  # fmt: skip
    """(sure, possible) links of one line; without `gold` every link is sure (and possible).
    `lengths` (source and target words) bounds the indices; `where` names the line in errors."""
    sure: set[Link] = set()
    possible: set[Link] = set()
    shift = 1 if one_based else 0
    for token in line.split():
        m = _LINK.match(token)
        if not m or (m.group(2) == "p" and not gold):
            want = "i-j or ipj" if gold else "i-j"
            raise MtxError(f"{where}: {token!r} is not a link ({want}, word indices)")
        i, j = int(m.group(1)) - shift, int(m.group(3)) - shift
        if i < 0 or j < 0:
            raise MtxError(f"{where}: {token!r}: indices are counted from 1 in this file")
        if lengths is not None and (i >= lengths[0] or j >= lengths[1]):
            raise MtxError(
                f"{where}: link {token!r} is out of range: the pair has {lengths[0]} source "
                f"and {lengths[1]} target words"
            )
        possible.add((i, j))
        if m.group(2) == "-":
            sure.add((i, j))
    return sure, possible


@dataclass(frozen=True)
class Alignments:
    """The links of a corpus, one entry per sentence pair: sure links, and possible ones
    (which include the sure ones)."""

    sure: list[set[Link]]
    possible: list[set[Link]]

    def __len__(self) -> int:
        return len(self.sure)


def read_text(path: str | Path) -> list[str]:
    """A text file's lines (without their line ends); refused in one line if absent."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise MtxError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None


def read_links(
    path: str | Path,
    sources: list[str] | None = None,
    targets: list[str] | None = None,
    gold: bool = False,
    one_based: bool = False,
) -> Alignments:
    """An alignment file's links. With `sources` and `targets` (the corpus, one sentence a
    line), the file must have as many lines, and each link must name words of its pair."""
    lines = read_text(path)
    if sources is not None and len(lines) != len(sources):
        raise MtxError(
            f"{path}: {len(lines)} lines, but the corpus has {len(sources)} sentence pairs"
        )
    sure, possible = [], []
    for n, line in enumerate(lines):
        lengths = None
        if sources is not None and targets is not None:
            lengths = (len(sources[n].split()), len(targets[n].split()))
        s, p = parse_links(line, f"{path}, line {n + 1}", lengths, gold, one_based)
        sure.append(s)
        possible.append(p)
    return Alignments(sure, possible)


def corpus(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """A parallel corpus's two sides, refused in one line if their line counts differ."""
    sources, targets = read_text(src_path), read_text(tgt_path)
    if len(sources) != len(targets):
        raise MtxError(f"{tgt_path}: {len(targets)} lines, but {src_path} has {len(sources)}")
    return sources, targets


def stream_pairs(src_path: str | Path, tgt_path: str | Path) -> Iterator[tuple[str, str]]:
    """A parallel corpus's pairs as they are read (bounded memory); refused in one line, when
    the shorter file ends, if the line counts differ."""
    try:
        with open(src_path, encoding="utf-8") as a, open(tgt_path, encoding="utf-8") as b:
            n = 0
            for x, y in zip_longest(a, b):
                if x is None or y is None:
                    short, long = (src_path, tgt_path) if x is None else (tgt_path, src_path)
                    raise MtxError(f"{short}: {n} lines, but {long} has more")
                n += 1
                yield x.rstrip("\r\n"), y.rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise MtxError(f"cannot read the corpus ({e.__class__.__name__}: {e})") from None
