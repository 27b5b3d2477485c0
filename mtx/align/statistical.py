"""Statistical word alignment of a parallel corpus with eflomal (Östling and Tiedemann 2016:
Bayesian IBM models with fertility and an HMM, sampled by Markov-chain Monte Carlo; PyPI
`eflomal`, a C core that mtx calls, not vendors).

Both directions are aligned and joined by grow-diag-final-and (symmetrise.py). The corpus
goes through in chunks of `chunk` pairs, so memory is bounded by a chunk whatever the corpus
size; each chunk runs `samplers` independent samplers in parallel (eflomal's OpenMP threads:
every core by default), whose samples eflomal averages. A pair with an empty side gets no link.

eflomal seeds its samplers from the system, so two runs give slightly different links: the
alignments are a teacher's suggestions (guided training), not a reproducible artefact.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from mtx.align.links import Link, parse_links, read_text
from mtx.align.symmetrise import grow_diag_final_and
from mtx.errors import MtxError

CHUNK = 250_000  # pairs aligned together: more see more co-occurrences, and take more memory


def default_samplers() -> int:
    return max(2, min(8, len(os.sched_getaffinity(0))))


def check_samplers(samplers: int) -> None:
    """0 (one a core) or 2 to 8 parallel samplers, as eflomal takes; else MtxError."""
    if samplers != 0 and not 2 <= samplers <= 8:
        raise MtxError(f"--samplers {samplers}: eflomal runs 2 to 8 samplers (0: one a core)")


def align_pairs(
    pairs: Iterable[tuple[str, str]], chunk: int = CHUNK, samplers: int = 0, log=None
) -> Iterator[set[Link]]:
    """The symmetrised links of each (source, target) pair of words, in order, a chunk of
    pairs at a time."""
    check_samplers(samplers)
    it = iter(pairs)
    done = 0
    while part := list(islice(it, chunk)):
        yield from align_chunk(part, samplers or default_samplers())
        done += len(part)
        if log:
            log(f"aligned {done:,} pairs")


def align_chunk(pairs: list[tuple[str, str]], samplers: int) -> list[set[Link]]:
    """eflomal over `pairs` in both directions, symmetrised."""
    try:
        from eflomal import Aligner
    except ImportError:  # pragma: no cover - a project dependency
        raise MtxError("statistical alignment needs eflomal: pip install eflomal") from None
    rows = [n for n, (s, t) in enumerate(pairs) if s.split() and t.split()]
    out: list[set[Link]] = [set() for _ in pairs]
    if not rows:
        return out
    sources = [" ".join(pairs[n][0].split()) + "\n" for n in rows]
    targets = [" ".join(pairs[n][1].split()) + "\n" for n in rows]
    with tempfile.TemporaryDirectory(prefix="mtx-align-") as tmp:
        fwd, rev = Path(tmp, "fwd"), Path(tmp, "rev")
        Aligner(n_samplers=samplers).align(
            sources, targets, links_filename_fwd=str(fwd), links_filename_rev=str(rev)
        )
        forward, backward = read_text(fwd), read_text(rev)
    if len(forward) != len(rows) or len(backward) != len(rows):
        raise MtxError(f"eflomal wrote {len(forward)} and {len(backward)} lines for {len(rows)}")
    for k, n in enumerate(rows):
        lengths = (len(sources[k].split()), len(targets[k].split()))
        where = f"eflomal's links for pair {n + 1}"
        f, _ = parse_links(forward[k], where, lengths)
        b, _ = parse_links(backward[k], where, lengths)
        out[n] = grow_diag_final_and(f, b)
    return out
