"""Translating documents (mtx/documents/): every line of a chunk read in its format
(decode.format), its sentences translated together with every other line's, in the same
batches, and each line's text made of its sentences' translations.

    read(items, settings, first)        -> Sentences: every sentence to translate, and whose
    results(sentences, outputs)         -> one Translation a line (decode/result.py)
    translate(translator, items, first) -> both, translated by a Translator
    stream(translator, lines, ...)      -> the same over an endless input, chunk by chunk

A line's translation is one `Output`: the assembled text, its score, log-probability and unmet
constraints the sums of its sentences'. A sentence is requested with its line's number (the
seed of its samples) and its line's controls that apply to each sentence (controls.py's
`each_sentence`: avoid); a glossary's terms are found in each sentence; the other controls
(a prefix, constraints, alternatives: one sentence's) are refused in one line. A sentence's word links are read (decode/align.py) only where it has marks to put back.
The server's own process reads and assembles with `read` and `results` (no torch here).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from mtx.decode.controls import CONTROLS, Controls, Line
from mtx.decode.result import Output, Translation
from mtx.documents.document import Document, Settings
from mtx.errors import MtxError


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Sentences:
    """The documents of a chunk of lines, and every sentence of them to translate, in order."""

    docs: list[Document] = field(default_factory=list)
    items: list[str | Line] = field(default_factory=list)  # each sentence, with its controls
    owner: list[int] = field(default_factory=list)  # its document
    numbers: list[int] = field(default_factory=list)  # its line's number
    links: list[bool] = field(default_factory=list)  # whether its word links are needed


def settings_of(cfg, decode=None) -> Settings:
    """The document settings of a config (its decode.*, or `decode`; the source language)."""
    return Settings.of(decode or cfg.decode, cfg.data.src_lang or "en")


def check(
    d, nbest: int, attention: bool, alignments: bool | None = None, needs: str = "one checkpoint"
) -> None:
    """Refuse, in one line, what a format other than plain cannot give (`d`: a DecodeConfig):
    n-best lists and word alignments (of one sentence each), and marks without one model's
    attention (`attention`: the model reads it; `needs`: what gives it)."""
    Settings.of(d, "en")  # the format and the placeholders' patterns, checked now
    fmt = d.format
    if fmt == "plain":
        return
    if nbest > 1:
        raise MtxError(f"decode.format {fmt} gives one translation a text: no n-best")
    if d.alignments if alignments is None else alignments:
        raise MtxError(f"decode.format {fmt}: alignments are a sentence's, not a text's")
    if not attention and (fmt != "paragraphs" or d.placeholders):
        raise MtxError(
            f"decode.format {fmt} puts marks back by the word alignment, read from one "
            f"model's attention: give {needs} (or paragraphs with no placeholders)"
        )


def read(
    items: Iterable[str | Line],
    settings: Settings,
    first: int = 0,
    glossary=None,
    say: Callable[[str], None] = _stderr,
    name: Callable[[int], str] = lambda number: f"line {number + 1}",
) -> Sentences:
    """The documents of `items` (lines numbered from `first`) and their sentences; what the
    parser repaired is said (`say`), naming the line (`name` of its number)."""
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
        for note in doc.repairs:
            say(f"{where}: {note}")
        for sentence, marked in zip(doc.sentences, doc.needs_links()):
            line = Line(sentence, controls)
            if glossary is not None:
                line = glossary.apply(line, where)
            out.items.append(line if line.controls or line.terms else sentence)
            out.owner.append(len(out.docs))
            out.numbers.append(number)
            out.links.append(marked)
        out.docs.append(doc)
    return out


def results(sentences: Sentences, outputs: list[Output]) -> list[Translation]:
    """One translation a document from its sentences' `outputs` (in order; `links` where
    `sentences.links` asks)."""
    per_doc: list[list[Output]] = [[] for _ in sentences.docs]
    for owner, output in zip(sentences.owner, outputs, strict=True):
        per_doc[owner].append(output)
    out = []
    for doc, done in zip(sentences.docs, per_doc):
        text = doc.assemble([(o.text, o.links) for o in done])
        scores = [o.score for o in done]
        probs = [o.log_prob for o in done]
        output = Output(
            text,
            None if None in scores else float(sum(scores)),
            None if None in probs else float(sum(probs)),
            sum(o.unmet for o in done),
        )
        out.append(Translation((output,)))
    return out


def translate(
    translator, items: list[str | Line], first: int = 0, glossary=None, say=_stderr, report=None
) -> list[Translation]:
    """Each line's translation (a Translator's `translate_requests` over every sentence);
    `report` (glossary.py's Report) counts the sentences' constraints and terms."""
    sentences = read(items, settings_of(translator.cfg), first, glossary, say)
    requests = [translator.request(x, n) for x, n in zip(sentences.items, sentences.numbers)]
    hyps = translator.translate_requests(requests)
    marked = [k for k, needed in enumerate(sentences.links) if needed]
    if marked:
        aligned = translator.aligned([requests[k] for k in marked], [hyps[k] for k in marked])
        for k, found in zip(marked, aligned):
            hyps[k] = found
    outputs = [translator.translation(found).best for found in hyps]
    if report is not None:
        for item, output in zip(sentences.items, outputs):
            if isinstance(item, Line):
                report.add(item, output.text, output.unmet)
    return results(sentences, outputs)


def stream(
    translator, lines: Iterable, chunk_lines: int, idle: float | None, first: int = 0,
    glossary=None, say=_stderr, report=None,
) -> Iterator[Translation]:  # fmt: skip
    """`translate` over an endless iterable, chunk by chunk (decode/stream.py); the settings
    checked now, before any line is read."""
    from mtx.decode.stream import chunks

    check(translator.cfg.decode, 1, translator.model.capabilities.attention)
    translator.check_language()

    def run() -> Iterator[Translation]:
        number = first
        for chunk in chunks(lines, chunk_lines, idle):
            yield from translate(translator, chunk, number, glossary, say, report)
            number += len(chunk)

    return run()
