"""Tag transfer: a tagged source and its plain translation (written by a person, or
post-edited) -> that translation with the source's markup and placeholders placed, as CAT tools
put tags back into a translated segment (docs/documents.md, `mtx align transfer`).

The source is read in its format (documents/document.py) as one sentence a block of text (no
sentence splitting: the translation is given whole), the pair is aligned by the model's forced
pass (align.py: the source's sentence, the given translation), and the marks are placed by the
rules of documents/project.py, as `--format` places them on the model's own translation. Every
guarantee of `--format` holds: the output parses, with the same elements and attributes, each
placeholder verbatim (a placeholder the translation repeats is taken out of it first, so that it
is written once, where the alignment puts it); the given text's other words are kept as given,
in order, one space apart.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from mtx.decode.align import Aligner
from mtx.decode.parts import Parts
from mtx.documents.document import Document, Settings
from mtx.errors import MtxError


class Transfer:
    """Places a source's marks onto given translations with one model's word alignment."""

    def __init__(self, parts: Parts, fmt: str, tgt_lang: str | None = None) -> None:
        if fmt == "plain":
            raise MtxError("tag transfer reads marks: give --format paragraphs, html or xml")
        self.aligner = Aligner(parts, tgt_lang)
        lang = parts.config.data.src_lang
        settings = Settings.of(parts.config.decode, lang, fmt)
        self.settings = dataclasses.replace(settings, split=False)  # one sentence a block

    def lines(
        self, sources: list[str], targets: list[str], first: int = 0
    ) -> list[tuple[str, tuple[str, ...]]]:
        """Each target with its source's marks, and what the parser repaired in the source
        (notes naming the line); `first`: the first pair's number from 0."""
        docs = [Document.read(s, self.settings) for s in sources]
        targets = [self._without_placeholders(s, t) for s, t in zip(sources, targets, strict=True)]
        for n, (doc, target) in enumerate(zip(docs, targets)):
            if len(doc.sentences) > 1:
                raise MtxError(
                    f"line {first + n + 1}: {len(doc.sentences)} blocks of text (paragraphs, "
                    "list items, cells) but one translation: give one block a line"
                )
            if not doc.sentences and target.split():
                raise MtxError(
                    f"line {first + n + 1}: a source without words, a translation with some"
                )
        asked = [n for n, doc in enumerate(docs) if doc.sentences]
        scorer, codec = self.aligner.scorer, self.aligner.parts.codec
        src = [codec.encode(docs[n].sentences[0], scorer.tgt_lang) for n in asked]
        tgt = [scorer.target_ids(targets[n], first + n)[:-1] for n in asked]
        links = dict(zip(asked, self.aligner.word_links(src, tgt)))
        out = []
        for n, (doc, target) in enumerate(zip(docs, targets)):
            given = [(target, links[n])] if n in links else []  # its words one space apart
            notes = tuple(f"line {first + n + 1}: {r}" for r in doc.repairs)
            out.append((doc.assemble(given), notes))
        return out

    def _without_placeholders(self, source: str, target: str) -> str:
        """The target without the placeholders it shares with the source (a translator keeps
        `{name}`): the source's are placed where the alignment says, once each."""
        pattern = self.settings.pattern
        if pattern is None:
            return " ".join(target.split())
        left = Counter(m.group() for m in pattern.finditer(source))
        parts, position = [], 0
        for m in pattern.finditer(target):
            if left[m.group()] > 0:
                left[m.group()] -= 1
                before = target[position : m.start()]
                glued = m.end() < len(target) and not target[m.end()].isspace()
                # "und {name}." reads "und." as the source's "and {name}." reads "and."
                parts.append(
                    before.rstrip() if glued and (before or " ")[-1:].isspace() else before
                )
                position = m.end()
        return " ".join("".join(parts + [target[position:]]).split())
