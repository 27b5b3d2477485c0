"""What `mtx translate` makes of its input lines and how it writes their translations: plain
text, or with --json, lines with controls (mtx/decode/controls.py) and JSON out."""

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


def read_items(lines, json_lines: bool, first: int = 0):
    """Input lines as the Translator takes them: plain strings, or with `json_lines` each a
    `Line` with its controls (an error names the line)."""
    if not json_lines:
        yield from lines
        return
    from mtx.decode.controls import parse_line

    for number, raw in enumerate(lines, start=first + 1):
        yield parse_line(raw, f"line {number}")


class Output:
    """How a line's translation is written under `options`: text (with nbest > 1, 'LINE |||
    TEXT ||| SCORE ||| LOG-PROBABILITY' lines; with alignments, ' ||| 0-0 1-2' after each) or,
    with --json, one JSON object; what the translator notes of it (a repair, constraints that
    cannot fit) said on stderr."""

    def __init__(self, translator, options, json_lines: bool) -> None:
        self.translator, self.options, self.json_lines = translator, options, json_lines

    def __call__(self, number: int, translation) -> str:
        for note in translation.notes:
            log(note)
        o = self.options
        if self.json_lines:
            return json.dumps(translation.to_json(o.nbest), ensure_ascii=False) + "\n"
        best = translation.best
        if o.nbest == 1:
            return best.text + (f" ||| {best.pharaoh()}" if o.alignments else "") + "\n"
        return "".join(out.nbest_line(number, o.alignments) for out in translation.outputs)

    def say_report(self) -> None:
        """The run's count of constraints and glossary terms, and what a draft model's drafts
        were worth, on stderr, if it had any."""
        for line in self.translator.stats.summaries():
            log(line)
