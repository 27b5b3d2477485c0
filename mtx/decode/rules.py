"""The rules of search, written once: what every engine that must translate alike calls.

Shape legend: N hypothesis rows (B sentences x K beams), V vocabulary, B sentences, K beam size.

The shrinking search (search.py), the static search (static.py), the server's CTranslate2
engine (serve/engine.py) and the peer benchmark (mtx/bench/peers.py) call these, so that a
rule changed here changes in every one of them (tests/test_rules.py checks that each search
follows a changed rule, not only that their outputs agree):

- the longest output of a sentence: a * source tokens (EOS excluded) + b, EOS included, at
  least 1 and at most the model's limit (`max_lengths`); at that length a hypothesis may
  only end (`at_limit`, `only_eos`), and its sentence is done;
- PAD, UNK and BOS are never produced (`mask_never_produced`; a MarianMT vocabulary has no
  BOS, its id 2 is a piece: `Specials.never_below`, mtx/tokens.py); the first input is the
  model's `specials.start`;
- all beams start equal, so only the first expands at the first step (`start_beams`); each
  step considers the best 2K continuations of a sentence's K live hypotheses
  (`top_candidates`); those among the best K that end in EOS finish (`finishing`); the best
  K that do not end continue (`continuing`);
- a finished hypothesis is scored log P(Y) / lp(Y), with the length penalty of Wu et al.
  (2016), lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| counting EOS (`finished_score`); with
  `stopping: k_finished` a sentence is done once it has K finished hypotheses
  (`enough_finished`); with `exact`, once no live hypothesis can still beat its n-th best
  finished one, with `never` at its longest output only (`sentence_done`); its n-best are the
  best scored, in finishing order among equals (`best`).

A sentence's controls (decode/controlled.py) add four rules: its target prefix is forced, one
token a step (`force_tokens`); it may not end while a hard constraint is unmet, unless at its
longest output (`block_eos`); a token that would complete an avoided phrase is ruled out
(`ban`); and the beams are shared among the candidates by how many constraint tokens each has
met (`allocate`: dynamic beam allocation, Post and Vilar 2018, as Hu et al. 2019 vectorise
it). A hypothesis that had to end with constraints unmet ranks after every one that met them
(`best`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from mtx.config.decode import Stopping
from mtx.decode.options import Options
from mtx.model.groups import Groups
from mtx.tokens import EOS_ID, PAD_ID, Specials, longest_output

_ASKED = Options()  # a request's options by default: the decode.* settings' defaults


@dataclass(frozen=True)
class SearchSettings:
    """What a search is told, one typed object for every search (search.py's greedy and
    beam search, static.py's), made from a request's options (options.py) and the model's
    limit: the beam, the length penalty's alpha, the longest output (a * source tokens + b,
    EOS included, never over `limit`: `max_lengths`) and when a sentence is done
    (`stopping`: k_finished is the static search's only rule). Greedy search reads the
    lengths alone. Its defaults are the options', which are the decode.* settings'."""

    beam: int = _ASKED.beam
    alpha: float = _ASKED.alpha
    max_len_a: float = _ASKED.max_len_a
    max_len_b: int = _ASKED.max_len_b
    limit: int = 1024  # the model's (max_positions - 1)
    stopping: Stopping = _ASKED.stopping

    @classmethod
    def of(cls, o: Options, limit: int, **changes) -> SearchSettings:
        """The settings of options `o` and the model's `limit`."""
        values = dict(beam=o.beam, alpha=o.alpha, max_len_a=o.max_len_a, max_len_b=o.max_len_b)
        return cls(**(values | {"limit": limit, "stopping": o.stopping} | changes))


def never_produced(specials: Specials) -> list[int]:
    """The ids no output contains: PAD, UNK and (where the vocabulary has one) BOS."""
    return list(range(specials.never_below))


@dataclass
class Hypothesis:
    """What a search returns for a sentence, one per n-best entry."""

    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # what the search ranks by: log_prob / length penalty for beam search
    log_prob: float  # sum of the model's log-probabilities of tokens and EOS
    unmet: int = 0  # hard constraints it lacks (it reached its longest output first)
    links: tuple[tuple[int, int], ...] | None = None  # word alignment (decode.alignments)


def source_lengths(src: Tensor | Groups) -> Tensor:
    """(B,) tokens of each source (B, S) (EOS excluded, padding not counted); the rows of
    every group of a `Groups` batch, in order."""
    if isinstance(src, Groups):
        return torch.cat([source_lengths(part) for part in src.parts])
    return (src != PAD_ID).sum(1) - 1


def max_lengths(src_len: Tensor | int, a: float, b: int, limit: int) -> Tensor | int:
    """The longest output, EOS included, of sources of `src_len` tokens (EOS excluded):
    a * src_len + b, at least 1 and at most `limit` (the model's longest sequence), computed
    in float32 for an int as for a tensor, so both give the same length."""
    if isinstance(src_len, int):
        return longest_output(src_len, a, b, limit)
    return (a * src_len.float() + b).long().clamp(min=1, max=limit)


def at_limit(length: int | Tensor, max_len: int | Tensor) -> bool | Tensor:
    """Whether an output of `length` tokens (EOS included, if it ended now) reaches its
    sentence's longest: it may then only end, and its sentence is done."""
    return length >= max_len


def mask_never_produced(lprobs: Tensor, specials: Specials) -> Tensor:
    """(N, V) log-probabilities with PAD, UNK and BOS (`never_produced`) ruled out, in place."""
    lprobs[:, : specials.never_below] = -torch.inf
    return lprobs


def only_eos(lprobs: Tensor, rows: Tensor) -> Tensor:
    """(N, V) log-probabilities where the rows `rows` ((N,) bool) may only end: every token
    but EOS ruled out there."""
    not_eos = torch.arange(lprobs.size(1), device=lprobs.device) != EOS_ID
    return lprobs.masked_fill(rows.unsqueeze(1) & not_eos, -torch.inf)


def candidate_rules(vocab: int, specials: Specials, device: torch.device) -> Tensor:
    """(2, vocab) bool: which tokens a hypothesis may produce, by the rules of
    `mask_never_produced` (row 0) and, where it may only end, of `only_eos` too (row 1); what
    a lexical shortlist's candidates are masked by (decode/shortlist.py)."""
    free = mask_never_produced(torch.zeros(1, vocab, device=device), specials)
    forced = only_eos(free, torch.ones(1, dtype=torch.bool, device=device))
    return torch.cat([free, forced]) > -torch.inf


def start_beams(scores: Tensor) -> Tensor:
    """(B, K) cumulative scores before the first step, in place: all beams start equal, so
    only the first one may expand at step 1."""
    scores.fill_(-torch.inf)
    scores[:, 0] = 0.0
    return scores


def top_candidates(
    scores: Tensor, lprobs: Tensor, K: int, in_place: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """scores (B, K) of the live beams, lprobs (B * K, V) of their next token -> the best 2K
    continuations of each sentence: cumulative scores, source beam and token, each (B, 2K),
    best first. `in_place`: the cumulative scores are written over `lprobs` (which the caller
    no longer needs) rather than into a new tensor, the same numbers."""
    B, V = scores.size(0), lprobs.size(-1)
    if in_place:
        cand = lprobs.view(B, K, V).add_(scores.unsqueeze(-1)).view(B, K * V)
    else:
        cand = (scores.unsqueeze(-1) + lprobs.view(B, K, V)).view(B, K * V)
    top, idx = cand.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
    return top, idx // V, idx % V


def finishing(top: Tensor, tok: Tensor, K: int) -> Tensor:
    """(B, K) bool: the candidates among the best K (of `top_candidates`) that end in EOS with
    a possible score: these finish."""
    return (tok[:, :K] == EOS_ID) & (top[:, :K] > -torch.inf)


def continuing(tok: Tensor, K: int) -> Tensor:
    """(B, K) indices into the 2K candidates (best first) of the best K that do not end in
    EOS: the next beams."""
    order = (tok == EOS_ID).long() * tok.size(1) + torch.arange(tok.size(1), device=tok.device)
    return order.argsort(dim=1)[:, :K]


def length_penalty(length: int, alpha: float) -> float:
    """Wu et al. (2016): ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def finished_score(log_prob: float, length: int, alpha: float) -> float:
    """A finished hypothesis's score: log P(Y) / lp(|Y|), |Y| counting EOS."""
    return log_prob / length_penalty(length, alpha)


def enough_finished(finished: int | Tensor, K: int) -> bool | Tensor:
    """`stopping: k_finished`: a sentence with K finished hypotheses is done."""
    return finished >= K


def best(hyps: list[Hypothesis], nbest: int) -> list[Hypothesis]:
    """The `nbest` best finished hypotheses, best first (equals in the order they finished);
    those with hard constraints unmet after all that met them."""
    return sorted(hyps, key=lambda h: (h.unmet, -h.score))[:nbest]


def force_tokens(lprobs: Tensor, forced: Tensor) -> Tensor:
    """(N, V) log-probabilities where row n must produce `forced[n]` ((N,) ids; -1: free):
    every other token ruled out there, the forced one keeping its log-probability."""
    rows = forced >= 0
    at = forced.clamp(min=0).unsqueeze(1)  # a free row writes its own value back at 0
    kept = lprobs.gather(1, at)
    return lprobs.masked_fill(rows.unsqueeze(1), -torch.inf).scatter_(1, at, kept)


def take_forced(tok: Tensor, forced: Tensor) -> Tensor:
    """(N,) the tokens rows take where `forced[n]` ((N,) ids; -1: free) forces one, else
    `tok`: what the argmax of `force_tokens`' log-probabilities picks, without masking every
    token of the rows (what a search that takes one token a row needs)."""
    return torch.where(forced >= 0, forced, tok)


def only_tokens(lprobs: Tensor, rows: Tensor, allowed: Tensor) -> Tensor:
    """(N, V) log-probabilities where the rows `rows` ((N,) bool) may only produce the tokens
    `allowed` ((V,) bool): after a prefix, a token that begins a word (or ends the output)."""
    return lprobs.masked_fill(rows.unsqueeze(1) & ~allowed, -torch.inf)


def block_eos(lprobs: Tensor, rows: Tensor) -> Tensor:
    """(N, V) log-probabilities where the rows `rows` ((N,) bool: hard constraints unmet, not
    at their longest output) may not end."""
    lprobs[:, EOS_ID] = lprobs[:, EOS_ID].masked_fill(rows, -torch.inf)
    return lprobs


def ban(lprobs: Tensor, rows: Tensor, tokens: Tensor) -> Tensor:
    """(N, V) log-probabilities with token `tokens[i]` ruled out in row `rows[i]` (each (I,)):
    the last token of an avoided phrase whose beginning the row ends with."""
    lprobs[rows, tokens] = -torch.inf
    return lprobs


def allocate(scores: Tensor, banks: Tensor, usable: Tensor, K: int) -> Tensor:
    """The next K beams of each sentence among its M candidates (scores, banks and usable,
    each (B, M)): indices (B, K) into the candidates.

    Dynamic beam allocation (Post and Vilar 2018) as Hu et al. (2019) vectorise it: a
    candidate's bank is how many constraint tokens it has met; candidates are ranked by score
    within their bank, and the beams are dealt round-robin, best rank first and, among equal
    ranks, the bank that has met most first. So the hypothesis that has met most constraints
    always keeps a beam, and a sentence without constraints (one bank) keeps its best K in
    score order. Unusable candidates (ending in EOS, or no candidate at all) are never taken;
    candidates of score -inf only when too few others are left."""
    B, M = scores.shape
    order = scores.argsort(dim=1, descending=True, stable=True)
    bank, usable = banks.gather(1, order), usable.gather(1, order)
    possible = usable & (scores.gather(1, order) > -torch.inf)
    C = int(bank.max()) + 1 if bank.numel() else 1
    seen = (torch.nn.functional.one_hot(bank, C) * possible.unsqueeze(2)).cumsum(1)
    rank = seen.gather(2, bank.unsqueeze(2)).squeeze(2) - 1  # among the possible of its bank
    priority = rank * C + (C - 1 - bank)
    position = torch.arange(M, device=scores.device).expand(B, M)
    priority = torch.where(possible, priority, M * C + position)
    priority = torch.where(usable, priority, 2 * M * C + position)
    return order.gather(1, priority.argsort(dim=1, stable=True)[:, :K])


def check_stopping(stopping: str) -> None:
    if stopping not in get_args(Stopping):
        raise ValueError(f"stopping must be one of {get_args(Stopping)}, got {stopping!r}")


def sentence_done(
    fin: list[Hypothesis],
    live_best: float,
    longest: int,
    K: int,
    nbest: int,
    alpha: float,
    stopping: str,
) -> bool:
    """Whether a sentence's beam search may end by `stopping` (config's Stopping), besides reaching
    its longest output: k_finished once K hypotheses have ended (`enough_finished`); exact once
    no live one (best score `live_best` <= 0, at most `longest` tokens) can still beat the
    nbest-th finished one; never, not before its longest output.

    Log-probabilities only fall as a hypothesis grows, and lp grows with length, so a live
    hypothesis of log-probability s can at best finish with s / lp(longest): with exact the
    result is the one the beam would reach if every hypothesis ran to its longest output."""
    if stopping == "k_finished":
        return bool(enough_finished(len(fin), K))
    if stopping == "never" or len(fin) < nbest:
        return False
    nth = sorted((h.score for h in fin), reverse=True)[nbest - 1]
    return nth >= live_best / length_penalty(longest, alpha)  # live_best <= 0
