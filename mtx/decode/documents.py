"""Documents (mtx/documents/) as a translator reads and assembles them: every line of a chunk
read in its format (decode.format), its sentences translated together with every other line's,
in the same batches, and each line's text made of its sentences' translations.

    read(items, settings, first)     -> Sentences: every sentence to translate, and whose
    results(sentences, outputs)      -> one Translation a line (decode/result.py)

The Translator (translator.py) translates the sentences in between; the server's own process
reads and assembles with these too (serve/app.py: no torch here). A line's translation is one
`Output`: the assembled text, its score, log-probability and unmet constraints the sums of its
sentences'; what the reading repaired comes with it as notes naming the line. A sentence is
requested with its line's number (the seed of its samples) and its line's controls that apply
to each sentence (controls.py's `each_sentence`: avoid); a glossary's terms are found in each
sentence; the other controls (a prefix, constraints, alternatives: one sentence's) are refused
in one line. A sentence's word links are read (decode/align.py) only where it has marks to put
back. What a format cannot give (n-best lists, alignments, marks without one model's
attention) the engine table refuses (engines.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mtx.decode.controls import CONTROLS, Controls, Line
from mtx.decode.result import Output, Translation
from mtx.documents.document import Document, Settings
from mtx.errors import MtxError


@dataclass(frozen=True)
class DocSentence:
    """One sentence of a document to translate."""

    item: str | Line  # its text, with its controls and glossary terms where it has some
    owner: int  # its document's index among the chunk's
    number: int  # its line's number (from 0: the seed of its samples)
    links: bool  # whether its word links are needed (it has marks to put back)


@dataclass
class Sentences:
    """The documents of a chunk of lines, and every sentence of them to translate, in order."""

    docs: list[Document] = field(default_factory=list)
    notes: list[tuple[str, ...]] = field(default_factory=list)  # each document's repairs
    sentences: list[DocSentence] = field(default_factory=list)


def settings_of(cfg, fmt: str) -> Settings:
    """The document settings of a config's decode.* for format `fmt` (the source language)."""
    return Settings.of(cfg.decode, cfg.data.src_lang or "en", fmt)


def read(
    items: Iterable[str | Line],
    settings: Settings,
    first: int = 0,
    glossary=None,
    name: Callable[[int], str] = lambda number: f"line {number + 1}",
) -> Sentences:
    """The documents of `items` (lines numbered from `first`) and their sentences; what the
    parser repaired, as notes naming the line (`name` of its number)."""
    out = Sentences()
    for i, item in enumerate(items):
        number = first + i
        where = name(number)
        text, controls = (item, Controls()) if isinstance(item, str) else (item.text, item.controls)
        asked = [name for name in controls if not CONTROLS[name].each_sentence]
        if asked:
            each = [c.name for c in CONTROLS.values() if c.each_sentence]
            raise MtxError(
                f"{where}: {asked[0]} is one sentence's: not with decode.format "
                f"{settings.format} ({', '.join(each)} and a glossary's terms apply to each "
                "sentence)"
            )
        doc = Document.read(text, settings)
        for sentence, marked in zip(doc.sentences, doc.needs_links()):
            line = Line(sentence, controls)
            if glossary is not None:
                line = glossary.apply(line, where)
            kept = line if line.controls or line.terms else sentence
            out.sentences.append(DocSentence(kept, len(out.docs), number, marked))
        out.docs.append(doc)
        out.notes.append(tuple(f"{where}: {note}" for note in doc.repairs))
    return out


def results(sentences: Sentences, outputs: list[Output]) -> list[Translation]:
    """One translation a document from its sentences' `outputs` (in order; `links` where
    `sentences.links` asks)."""
    per_doc: list[list[Output]] = [[] for _ in sentences.docs]
    for sentence, output in zip(sentences.sentences, outputs, strict=True):
        per_doc[sentence.owner].append(output)
    out = []
    for doc, done, notes in zip(sentences.docs, per_doc, sentences.notes):
        text = doc.assemble([(o.text, o.links) for o in done])
        scores = [o.score for o in done]
        probs = [o.log_prob for o in done]
        output = Output(  # a document without sentences has no score, as an empty line has none
            text,
            None if None in scores or not done else float(sum(scores)),
            None if None in probs or not done else float(sum(probs)),
            sum(o.unmet for o in done),
        )
        out.append(Translation((output,), notes=notes))
    return out
