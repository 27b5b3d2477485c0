"""A translated sentence with its marks put back (unit.py's marks): the placement rules.

Given a sentence's marks among its source words, the translation and the word alignment
(source word, target word), each span goes around the target words aligned to the words it
covered, from the first to the last of them (a target word that is only punctuation counts
only for a span that covered some punctuation: `<b>ein Iglu</b>` is `<b>an igloo</b> .` even if
the full stop attended to the igloo), and each kept mark goes before (after) the first
(last) target word aligned to the word it stood before (after). Then, so that the result is
always one well-formed tree holding every mark once:

- an unaligned span (none of its words aligned) takes the words at its relative place in the
  sentence (at least one); a kept mark before (after) an unaligned word goes before (after)
  the target words of the next (previous) aligned word, else of the previous (next) one;
- a nested span is cut to its parent's words, and takes all of them if nothing is left;
- two spans of one parent that would cross: the later one starts where the earlier ends (it may
  be left empty, kept as an empty element, never dropped);
- a kept mark goes into the deepest span around its place (its own first, where it fits);
- a kept mark inside a word (`{name},`, `fahr<br>e`) goes inside the aligned target word at the
  same punctuation (`,` ending both words), else at the nearer edge of that word;
- spacing: words one space apart, an opening tag glued to the word after it, a closing tag to
  the word before it, a kept mark glued on a side where it was glued in the source.

`project` gives atoms (atoms.py): words, spans' openings and closings, kept marks and the
spaces between them, which document.py writes as text and markup.py as elements.
"""

from __future__ import annotations

from collections import defaultdict

from mtx.documents.atoms import SPACE, Atom, Kind
from mtx.documents.unit import Mark, Sentence


def project(sentence: Sentence, marks: list[Mark], target: str, links) -> list[Atom]:
    """The atoms of `target`, the translation of `sentence`, with the sentence's marks;
    `links`: (source word, target word) pairs."""
    words = target.split()
    n, m = len(sentence.words), len(words)
    aligned: dict[int, list[int]] = defaultdict(list)
    for i, j in links or ():
        if 0 <= i < n and 0 <= j < m:
            aligned[i].append(j)
    plan = _Plan(sentence, marks, words, aligned)
    plan.resolve(None, 0, m)
    plan.cuts()
    plan.place_kept()
    return _spaced(plan.render(None, 0, m))


class _Plan:
    def __init__(self, sentence: Sentence, marks: list[Mark], words, aligned) -> None:
        self.s, self.marks, self.words, self.aligned = sentence, marks, words, aligned
        self.n, self.m = len(sentence.words), len(words)
        self.spans: dict[int, tuple[int, int]] = {}  # resolved target intervals
        self.kids: dict[int | None, list[int]] = defaultdict(list)
        for key in sentence.spans:
            self.kids[self._parent(key)].append(key)
        self.at: dict[int | None, list[tuple[int, int]]] = defaultdict(list)  # boundary, key
        self.inside: dict[tuple[int | None, int], list[tuple[int, int]]] = defaultdict(list)
        self.glue: dict[int, tuple[bool, bool]] = {}

    def _parent(self, key: int) -> int | None:
        parent = self.marks[key].parent
        return parent if parent in self.s.spans else None

    def resolve(self, node: int | None, ps: int, pe: int) -> None:
        """Each span under `node` (its words [ps, pe)) projected, cut into it, uncrossed."""
        out = []
        for key in self.kids[node]:
            s, e = self._project_span(*self.s.spans[key])
            s, e = max(s, ps), min(e, pe)
            if s >= e:
                s, e = ps, pe
            out.append((s, e, key))
        end = ps
        for s, e, key in sorted(out):
            s = max(s, end)
            e = max(e, s)
            self.spans[key] = (s, e)
            end = e
        self.kids[node] = [key for _, _, key in sorted(out)]
        self.kids[node].sort(key=lambda k: self.spans[k])
        for key in self.kids[node]:
            self.resolve(key, *self.spans[key])

    def _project_span(self, a: int, b: int) -> tuple[int, int]:
        js = [j for i in range(a, b) for j in self.aligned.get(i, ())]
        if not any(_punctuation(w) for w in self.s.strings[a:b]):
            js = [j for j in js if not _punctuation(self.words[j])] or js
        if js:
            return min(js), max(js) + 1
        if self.m == 0:
            return 0, 0
        s = min(self.m - 1, a * self.m // self.n)
        return s, min(self.m, max(s + 1, round(b * self.m / self.n)))

    def place_kept(self) -> None:
        for key, where in self.s.kept.items():
            parent = self.marks[key].parent
            if parent in self.s.kept:  # inside a span without words: written with it
                continue
            gl, gr = self.marks[key].glue or (False, False)
            if where[0] == "inside":
                found = self._inside(where[1], where[2])
                if found is not None:
                    j, offset = found
                    box = self._box(None, j, j + 1)  # the span that writes word j
                    self.inside[(box, j)].append((offset, key))
                    self.glue[key] = (gl, gr)
                    continue
                where = ("before", where[1]) if where[2] * 2 <= len(self.s.strings[where[1]]) \
                    else ("after", where[1])  # fmt: skip
            k = self._boundary(where)
            self.glue[key] = (False, gr) if where[0] == "before" else (gl, False)
            if where[0] == "at":
                self.glue[key] = (gl, gr)
            self.at[self._box(parent, k, k)].append((k, key))

    def _box(self, parent: int | None, s: int, e: int) -> int | None:
        """The span a kept mark at words [s, e) (a boundary when s == e) goes into: its own
        where it fits, else the deepest around it."""

        def around(key: int, own: bool) -> bool:
            a, b = self.spans[key]
            if s < e:
                return a <= s and e <= b
            return a <= s <= b if own else a < s < b

        if parent in self.spans and around(parent, True):
            return parent
        found = [key for key in self.spans if around(key, False)]
        return max(found, key=self._depth, default=None)

    def _depth(self, key: int) -> int:
        d = 0
        while (key := self._parent(key)) is not None:
            d += 1
        return d

    def _aligned_near(self, i: int, forward: bool) -> int | None:
        """The first (forward) or last target word aligned to word i or, if none, to its
        nearest aligned neighbour that way; as a boundary."""
        order = list(range(i, self.n)) + list(range(i - 1, -1, -1))
        if not forward:
            order = list(range(i, -1, -1)) + list(range(i + 1, self.n))
        for k in order:
            js = self.aligned.get(k)
            if js:
                if k == i:
                    return min(js) if forward else max(js) + 1
                return min(js) if k > i else max(js) + 1
        return None

    def _boundary(self, where: tuple) -> int:
        if where[0] == "at" or self.m == 0:
            return 0
        i = where[1]
        k = self._aligned_near(i, where[0] == "before")
        if k is None:
            k = round((i + (where[0] == "after")) * self.m / self.n)
        return max(0, min(self.m, k))

    def _inside(self, i: int, offset: int) -> tuple[int, int] | None:
        """(target word, characters into it) for a mark inside source word i, where the
        target word has the same punctuation at that side."""
        js = self.aligned.get(i)
        if not js:
            return None
        word = self.s.strings[i]
        prefix, suffix = word[:offset], word[offset:]
        last, first = self.words[max(js)], self.words[min(js)]
        if not any(c.isalnum() for c in suffix) and last.endswith(suffix) and last != suffix:
            return max(js), len(last) - len(suffix)
        if not any(c.isalnum() for c in prefix) and first.startswith(prefix) and first != prefix:
            return min(js), len(prefix)
        return None

    def render(self, node: int | None, s: int, e: int) -> list[Atom]:
        """Atoms of words [s, e) under `node`, each saying whether a space may go around it."""
        out: list[Atom] = []
        kids = list(self.kids[node])
        kept = sorted(self.at[node])
        k = s
        while True:
            while kept and kept[0][0] <= k:
                out += self._kept(kept.pop(0)[1])
            if kids and self.spans[kids[0]][0] <= k:
                key = kids.pop(0)
                before, after = self.cut.get(key, ("", ""))
                out += [Atom.word(before, True, False)] if before else []
                out.append(Atom(Kind.OPEN, key, not before, False))
                out += self.render(key, *self.spans[key])
                out.append(Atom(Kind.CLOSE, key, False, not after))
                out += [Atom.word(after, False, True)] if after else []
                k = max(k, self.spans[key][1])
                continue
            if k >= e:
                break
            out += self._word(node, k)
            k += 1
        for _, key in kept:  # past the end (cannot happen in a well-formed plan)
            out += self._kept(key)
        return out

    def cuts(self) -> None:
        """The punctuation a span began or ended inside a word at, taken out of its first and
        last target word where they have it (`Sentence.cuts`), to go outside it again."""
        self.cut: dict[int, tuple[str, str]] = {}
        self.trim: dict[int, list[int]] = {}  # target word: characters cut at its start, end
        for key, (before, after) in sorted(self.s.cuts.items()):  # the outermost span first
            s, e = self.spans[key]
            if s >= e:
                continue
            first, last = self.words[s], self.words[e - 1]
            trim_s, trim_e = self.trim.get(s, [0, 0]), self.trim.get(e - 1, [0, 0])
            before = before if first.startswith(before) and not trim_s[0] else ""
            after = after if last.endswith(after) and not trim_e[1] else ""
            if (s == e - 1 and len(before) + len(after) >= len(first)) or before == first \
                    or after == last:  # fmt: skip
                continue
            self.cut[key] = (before, after)
            if before:
                self.trim.setdefault(s, [0, 0])[0] = len(before)
            if after:
                self.trim.setdefault(e - 1, [0, 0])[1] = len(after)

    def _word(self, node: int | None, j: int) -> list[Atom]:
        word = self.words[j]
        lstrip, rstrip = self.trim.get(j, (0, 0))
        word = word[lstrip : len(word) - rstrip]
        marks = sorted(self.inside.get((node, j), ()))
        if not marks:
            return [Atom.word(word)]
        out, start = [], 0
        for offset, key in marks:
            offset = min(max(offset - lstrip, 0), len(word))
            out.append(Atom.word(word[start:offset]))
            out += self._kept(key)
            start = offset
        out.append(Atom.word(word[start:]))
        return [a for a in out if a.kind is not Kind.WORD or a.value]

    def _kept(self, key: int) -> list[Atom]:
        gl, gr = self.glue.get(key, self.marks[key].glue or (False, False))
        if key not in self.s.kept or not self.marks[key].span:
            return [Atom(Kind.KEEP, key, not gl, not gr)]
        inner = [k for k in self.s.marks if self.marks[k].parent == key]  # a wordless span
        out = [Atom(Kind.OPEN, key, not gl, False)]
        for k in inner:
            self.glue.setdefault(k, self.marks[k].glue or (False, False))
            out += self._kept(k)
        return out + [Atom(Kind.CLOSE, key, False, not gr)]


def _punctuation(word: str) -> bool:
    return not any(c.isalnum() for c in word)


def _spaced(atoms: list[Atom]) -> list[Atom]:
    """The atoms with a space between two that both allow one."""
    out: list[Atom] = []
    previous_after = False
    for atom in atoms:
        if out and previous_after and atom.space_before:
            out.append(SPACE)
        out.append(atom)
        previous_after = atom.space_after
    return out
