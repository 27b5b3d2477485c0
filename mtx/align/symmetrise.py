"""grow-diag-final-and (Koehn et al. 2003, Moses' and atools' default), which joins the links
of the two directions of a statistical aligner into one alignment:

1. start from the intersection of the two directions;
2. grow: while any link is added, for each link in order, add each neighbour (the 8 around
   it) that is in the union and whose source word or target word is still unaligned;
3. final-and: for each link of either direction (the forward's first), add it if both its
   words are still unaligned.
"""

from __future__ import annotations

from mtx.align.links import Link

NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def grow_diag_final_and(forward: set[Link], backward: set[Link]) -> set[Link]:
    """The symmetrised links of one pair from its two directions' (both as (source, target))."""
    links = forward & backward
    union = forward | backward
    src_aligned = {i for i, _ in links}
    tgt_aligned = {j for _, j in links}

    def add(i: int, j: int) -> None:
        links.add((i, j))
        src_aligned.add(i)
        tgt_aligned.add(j)

    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in NEIGHBOURS:
                k, m = i + di, j + dj
                if (
                    (k, m) in union
                    and (k, m) not in links
                    and (k not in src_aligned or m not in tgt_aligned)
                ):
                    add(k, m)
                    grown = True
    for direction in (forward, backward):
        for i, j in sorted(direction):
            if i not in src_aligned and j not in tgt_aligned:
                add(i, j)
    return links
