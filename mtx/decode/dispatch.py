"""Which search decodes a sentence, and which controls (controls.py) each search takes: the
one place that says what works with what.

Every search is declared here with the controls it honours (`Search.takes`); `choose` picks
the one that decodes a sentence from its controls and the decode settings, and `check` refuses,
in one line, a sentence whose controls its search does not take. The Translator checks each
request as it builds it (an error names the line), the server's own process each text before
it is queued (serve/front.py), and the searches (searches.py) run what `choose` picks. This
module imports no torch.

- a sentence without controls: sampling (decode.sampling), the static search (decode.search
  static or graphs; auto on CUDA), or the shrinking greedy or beam search;
- with controls: the alternatives search where it asks for alternatives, else the constrained
  beam search (dynamic beam allocation), both in the shrinking search only, so decode.sampling,
  decode.search static/graphs and decode.shortlist choose a search that takes no controls.
- with decode.draft (speculative greedy search, speculative.py): a sentence without controls;
  one with controls is decoded by the search its controls choose, without drafts (at beam 1
  that is greedy search under them, what speculation would give).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from mtx.decode.controls import Controls
from mtx.errors import MtxError


@dataclass(frozen=True)
class Search:
    """A search, as an error names it, and the controls it takes (their names)."""

    name: str
    takes: Set[str] = frozenset()
    plural: bool = False  # its name is a plural: "alternatives take no ..."

    def refusal(self, controls: Controls) -> str:
        """Why it cannot decode a sentence with `controls` ("" if it can)."""
        left = [name for name in controls if name not in self.takes]
        verb = "take" if self.plural else "takes"
        return f"{self.name} {verb} no {left[0]}" if left else ""


GREEDY = Search("greedy search")
BEAM = Search("beam search")
SAMPLING = Search("decode.sampling")
STATIC = Search("decode.search static or graphs")
SHORTLIST = Search("decode.shortlist")
SPECULATIVE = Search("decode.draft")
CONSTRAINED = Search("the constrained beam search", frozenset({"prefix", "constraints", "avoid"}))
ALTERNATIVES = Search("alternatives", frozenset({"prefix", "avoid", "alternatives"}), True)
SEARCHES = (GREEDY, BEAM, SAMPLING, STATIC, SHORTLIST, SPECULATIVE, CONSTRAINED, ALTERNATIVES)


def static_mode(search: str, device: str) -> str:
    """What decode.search runs on `device` ("cpu", "cuda"): shrinking, static or graphs."""
    if search == "auto":
        return "graphs" if device == "cuda" else "shrinking"
    return search


def choose(controls: Controls, d, device: str = "cpu") -> Search:
    """The search that decodes a sentence with `controls` under decode settings `d`
    (config's DecodeConfig) on `device`."""
    if not controls:
        if d.sampling:
            return SAMPLING
        if d.draft:
            return SPECULATIVE  # searches.py refuses the settings it cannot run with
        if static_mode(d.search, device) != "shrinking":
            return STATIC  # searches.py falls back to the shrinking one where it cannot run
        return GREEDY if d.beam == 1 else BEAM
    if d.sampling:
        return SAMPLING
    if d.search in ("static", "graphs"):
        return STATIC
    if d.shortlist:
        return SHORTLIST
    return ALTERNATIVES if controls.alternatives else CONSTRAINED


def check(controls: Controls, d, where: str = "", device: str = "cpu") -> Search:
    """The search `choose` picks, or MtxError (naming `where`) if it does not take every one
    of `controls`."""
    search = choose(controls, d, device)
    why = search.refusal(controls)
    if why:
        raise MtxError(f"{where}: {why}" if where else why)
    return search
