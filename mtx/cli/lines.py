"""What `mtx translate` makes of its input lines and how it writes their translations: plain
text, or with --json and --glossary, lines with controls (mtx/decode/controls.py) and JSON out,
counted in a report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mtx.cli.app import log


def load_glossary(path: Path | None):
    from mtx.decode.glossary import Glossary

    return None if path is None else Glossary.load(path)


def sha256_of(path: Path | None) -> str:
    return "none" if path is None else hashlib.sha256(path.read_bytes()).hexdigest()


class Reader:
    """Input lines as the Translator takes them: plain strings, or `Line`s with their controls
    (read from JSON with `json_lines`; a glossary's terms added)."""

    def __init__(self, json_lines: bool, glossary, documents: bool = False) -> None:
        """`documents`: lines in a format other than plain, whose glossary terms are found in
        each sentence (decode/documents.py), not here."""
        self.json_lines, self.glossary, self.documents = json_lines, glossary, documents

    @property
    def plain(self) -> bool:
        return not self.json_lines and (self.glossary is None or self.documents)

    def items(self, lines, first: int = 0):
        from mtx.decode.controls import Line, parse_line

        for number, raw in enumerate(lines, start=first + 1):
            where = f"line {number}"
            line = parse_line(raw, where) if self.json_lines else Line(raw)
            if self.glossary is None or self.documents:
                yield line
            else:
                yield self.glossary.apply(line, where)


class Output:
    """How a line's hypotheses are written: text (with --nbest, 'LINE ||| TEXT ||| SCORE |||
    LOG-PROBABILITY' lines; with --alignments, ' ||| 0-0 1-2' after each) or, with --json, one
    JSON object; a line with controls is counted
    in `report` and warned of (on stderr) when its constraints cannot fit its longest output."""

    def __init__(self, translator, nbest: int, json_lines: bool, glossary=None) -> None:
        from mtx.decode.glossary import Report

        self.translator, self.nbest, self.json_lines = translator, nbest, json_lines
        self.glossary = glossary if self.documents else None  # documents: in each sentence
        self.report = Report()

    @property
    def documents(self) -> bool:
        """Lines in a format other than plain (decode.format: decode/documents.py)."""
        return self.translator.cfg.decode.format != "plain"

    def check(self) -> None:
        """Refuse, in one line, what the format cannot give (decode/documents.py)."""
        from mtx.decode import documents

        t = self.translator
        documents.check(t.cfg.decode, self.nbest, t.model.capabilities.attention)

    def stream(self, lines, chunk_lines: int, idle: float | None, first: int = 0):
        """Each line's hypotheses (a plain line's) or translation (a document's), in order;
        the settings checked before any line is read."""
        if not self.documents:
            return self.translator.hypotheses_stream(lines, chunk_lines, idle, self.nbest, first)
        from mtx.decode import documents

        self.check()
        t = self.translator
        return documents.stream(
            t, lines, chunk_lines, idle, first, self.glossary, say=log, report=self.report
        )

    def __call__(self, number: int, hyps, item=None) -> str:
        from mtx.decode.result import Translation

        controls = None if item is None or isinstance(item, str) else item.controls
        if isinstance(hyps, Translation):  # a document's
            result, controls = hyps, None
        else:
            result = self.translator.translation(hyps, bool(controls and controls.alternatives))
        if controls is not None:
            self.count(number, item, result.best.text, result.best.unmet)
        if self.json_lines:
            return json.dumps(result.to_json(self.nbest), ensure_ascii=False) + "\n"
        aligned = self.translator.cfg.decode.alignments
        if self.nbest == 1:
            return result.best.text + (f" ||| {result.best.pharaoh()}" if aligned else "") + "\n"
        return "".join(o.nbest_line(number, aligned) for o in result.outputs)

    @property
    def reports(self) -> tuple:
        """What a corpus job sums over its processes (jobs/corpus.py): the count of
        constraints and glossary terms, and what the drafts were worth."""
        return self.report, self.translator.searches.draft_stats

    def say_report(self) -> None:
        """The run's count of constraints and glossary terms, and what a draft model's drafts
        were worth, on stderr, if it had any."""
        for report in self.reports:
            if report.summary():
                log(report.summary())

    def count(self, number: int, item, translation: str, unmet: int) -> None:
        from mtx.decode.controls import needed

        self.report.add(item, translation, unmet)
        if item.controls.constraints:
            request = self.translator.request(item, number)
            if not self.translator.fits(request):
                self.report.unfit += 1
                need = needed(request.controls)
                longest = self.translator.longest(request)
                log(
                    f"line {number + 1}: the prefix, constraints and EOS take {need} pieces but "
                    f"its longest output is {longest}: {unmet} constraint(s) unmet"
                )
