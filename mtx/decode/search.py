"""Greedy search, sampling and beam search over a model's `encode()` / `decode()` with a cache.

Shape legend: B sentences still being decoded, K beam size, V vocabulary, t steps so far.

The model is a `Decodable` (model/interface.py): `encode(src) -> (memory, src_mask)`,
`new_cache()`, and `decode(last_tokens (N, 1), memory, src_mask, cache) -> logits (N, 1, V)`
(log-probabilities where its `capabilities.log_probs`, as an ensemble's: decode/ensemble.py;
with `capabilities.candidates`, a shortlist's, it finds its continuations itself); the cache
(model/cache.py) holds what each hypothesis has decoded (the Transformer's self-attention keys
and values, the RNN's decoder state), one row per hypothesis, and what is computed from the
encoder output, one row per sentence, computed at the first step and shared by the sentence's
K beams: the search reorders the first (`reorder`) and selects the second (`select`).

A search decodes a `SearchBatch` (request.py): the padded sources and each row's `Request`
(a padded tensor alone is taken as sources with nothing asked of them). Every search decodes
incrementally, and a sentence leaves the batch as soon as it is done, so the work shrinks as
sentences end. Nothing depends on the other sentences of a batch: the maximum length (the
request's own, else a * source tokens + b, EOS included) and the stopping test are per sentence,
padding is masked, and sampling draws each sentence's random numbers from its own seed.
PAD, UNK and BOS are never produced; at the maximum length only EOS is allowed. These rules,
and those of the beam below, are written once in rules.py, which the static search
(static.py) follows too.

Beam search (the paper's settings: K = 4, alpha = 0.6, max length = source length + 50):
each step picks the best 2K continuations of the K live hypotheses of every sentence; those
ending in EOS among the first K are finished hypotheses, scored by the length penalty of Wu et
al. (2016), score(Y) = log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| counting EOS;
the best K that do not end become the next beam. When a sentence is done depends on
`stopping`:

- "k_finished" (the default, as fairseq, and Hugging Face with early_stopping=True): once it
  has K finished hypotheses.
- "exact": once no live hypothesis can still beat the n-th best finished one (n = nbest).
- "never": run to the maximum length (slow; the reference that "exact" is tested against).

Both are rules of rules.py (`sentence_done`).

Greedy search and sampling report score = log P(Y) (no length penalty: nothing is ranked).
Greedy search may take its tokens from a `Pick` (sampling's draws; a request's alternatives,
controlled.py) and decode `copies` of each sentence: one row until the pick branches it into
its copies (sampling at the first step, alternatives where their prefix ends), then one row a
copy, each ending on its own. Ended rows leave the batch once they are 1 / COMPACT of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from mtx.decode import rules
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis, SearchSettings
from mtx.model.groups import Groups
from mtx.model.interface import Decodable
from mtx.tokens import EOS_ID

COMPACT = 4  # greedy search drops ended rows once they are 1 / COMPACT of its rows


def next_log_probs(
    model: Decodable, last: Tensor, memory, src_mask, cache, force_eos: list[bool]
) -> Tensor:
    """(N, V) next-token log-probabilities of the N hypotheses whose last tokens are `last`
    (N, 1): PAD, UNK and BOS never; the rows where `force_eos` is True may only end."""
    out = model.decode(last, memory, src_mask, cache)[:, -1].float()  # (N, V)
    if model.capabilities.log_probs:
        lprobs = out
    elif out.device.type == "cpu" and out.is_contiguous():
        # over the logits: a fresh (N, V) tensor a step costs the CPU page faults (BENCHMARKS.md,
        # "int8 and fp32 on the CPU"); a strided view (several positions) gets its own
        lprobs = torch.log_softmax(out, dim=-1, out=out)
    else:
        lprobs = torch.log_softmax(out, dim=-1)
    lprobs = rules.mask_never_produced(lprobs, model.specials)
    if any(force_eos):
        lprobs = rules.only_eos(lprobs, torch.tensor(force_eos, device=lprobs.device))
    return lprobs


def _continuations(
    model: Decodable, last: Tensor, memory, src_mask, cache, force_eos: list[bool], scores: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2K continuations of each sentence's K live beams of cumulative `scores`
    (B, K) whose last tokens are `last` (B * K, 1), as rules.top_candidates gives them;
    among its candidates only for a model with a lexical shortlist (shortlist.py)."""
    if model.capabilities.candidates:
        return model.continuations(last, memory, src_mask, cache, force_eos, scores)
    lprobs = next_log_probs(model, last, memory, src_mask, cache, force_eos)
    return rules.top_candidates(scores, lprobs, scores.size(1), in_place=True)


@dataclass
class Sampling:
    """Ancestral sampling from softmax(logits / temperature), restricted to the `top_k` most
    probable tokens (0: all) and to the smallest set whose probability reaches `top_p`."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def pick(self, lprobs: Tensor, uniform: Tensor) -> Tensor:
        """(N, V) log-probabilities and (N,) uniform numbers in [0, 1) -> (N,) tokens, by
        inverting each row's cumulative distribution (over token ids in order) at `uniform`."""
        probs = torch.softmax(lprobs / self.temperature, dim=-1)
        if 0 < self.top_k < probs.size(-1):
            kth = probs.topk(self.top_k, dim=-1).values[:, -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            before = sorted_p.cumsum(-1) - sorted_p  # mass of the more probable tokens
            drop = before >= self.top_p * sorted_p.sum(-1, keepdim=True)  # the first never
            probs = probs.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), 0.0)
        cdf = probs.cumsum(-1)
        target = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(1)
        return tok.clamp(max=probs.size(-1) - 1)


def sentence_uniforms(seeds: list[list[int]], steps: int) -> Tensor:
    """(B, steps) uniform numbers, row i drawn from its own stream seeded by `seeds[i]`, so a
    sentence samples the same output whatever batch it is decoded in."""
    return torch.from_numpy(
        np.stack([np.random.default_rng(s).random(steps) for s in seeds])
    ).float()


class Pick(Protocol):
    """How greedy search chooses each row's next token in place of its most probable one,
    and, decoding `copies` of each sentence, when a sentence's one row becomes its copies."""

    def branch(self, rows: Tensor, t: int) -> Tensor:
        """(N,) bool: which of the live rows `rows` (N,) (their ids: a sentence decoded as one
        row is its first copy) become their sentence's copies at step t, before this step's
        pick; a pick that keeps something per row gives the copies their parent's."""

    def __call__(self, lprobs: Tensor, rows: Tensor, t: int) -> Tensor:
        """(N, V) log-probabilities of the live rows `rows` (N,) at step t -> their (N,)
        tokens. It may rule tokens out of `lprobs` in place, never the one it picks."""


@dataclass
class Sampled:
    """A `Pick` that samples: row r's draws are `uniforms[r]` (`sentence_uniforms`); a
    sentence's copies branch at the first step, each drawing its own."""

    sampling: Sampling
    uniforms: Tensor  # (rows, steps)

    @classmethod
    def seeded(cls, sampling: Sampling, seeds, rows: int, steps: int, device) -> Sampled:
        """Row i's `steps` draws from its own stream seeded by `seeds[i]`."""
        if seeds is None or len(seeds) != rows:
            raise ValueError("sampling needs one seed per row")
        return cls(sampling, sentence_uniforms(seeds, steps).to(device))

    def branch(self, rows: Tensor, t: int) -> Tensor:
        return torch.full_like(rows, t == 0, dtype=torch.bool)

    def __call__(self, lprobs: Tensor, rows: Tensor, t: int) -> Tensor:
        return self.sampling.pick(lprobs, self.uniforms[rows, t])


def _branch(
    split: list[bool], alive: list[int], copies: int, out: list[Hypothesis]
) -> tuple[list[int], list[int]]:
    """The rows of `alive` that `split` names become their sentence's `copies` rows (ids
    row, row + 1, ...), each starting from its parent's hypothesis: returns the new rows' ids
    and each one's parent (its index in `alive`)."""
    ids, parents = [], []
    for i, (row, s) in enumerate(zip(alive, split)):
        for j in range(copies if s else 1):
            ids.append(row + j)
            parents.append(i)
            if j:
                out[row + j] = Hypothesis(list(out[row].tokens), out[row].score, out[row].log_prob)
    return ids, parents


def _keep_rows(cache, src_mask: Tensor | Groups | None, rows: Tensor):
    """Greedy search's rows `rows` (N',) of the cache (the encoder's keys and values too: one
    row per row) and of the source mask, which it returns."""
    cache.reorder(rows)
    cache.select(rows)
    return None if src_mask is None else src_mask[rows]


def _extend(
    out: list[Hypothesis], alive: list[int], ended: list[bool], tok: Tensor, lp: Tensor
) -> list[int]:
    """Each live row's token (N,) and its log-probability added to the row's hypothesis in
    `out` (EOS ends it, marked in `ended`); returns the indices (in `alive`) of the rows that
    go on."""
    keep = []
    for i, (token, logp) in enumerate(zip(tok.tolist(), lp.tolist())):
        if ended[i]:
            continue
        hyp = out[alive[i]]
        hyp.log_prob += logp
        if token == EOS_ID:
            hyp.score, ended[i] = hyp.log_prob, True
        else:
            hyp.tokens.append(token)
            keep.append(i)
    return keep


@torch.inference_mode()  # no autograd bookkeeping: cheaper small operations
def greedy_search(
    model: Decodable,
    batch: SearchBatch | Tensor | Groups,
    settings: SearchSettings = SearchSettings(),
    sampling: Sampling | None = None,
    seeds: list[list[int]] | None = None,
    pick: Pick | None = None,
    copies: int = 1,
) -> list[Hypothesis]:
    """One hypothesis per row: the most probable token at every step, with `sampling` a token
    drawn at random (row i's draws seeded by `seeds[i]`), with `pick` the token it picks.
    With `copies` n (and a `pick`), each sentence of `batch` (B rows) gives n rows (B * n: row
    r a copy of sentence r // n): it is decoded as one row until `pick.branch` makes it n,
    which then go on, and end, each on its own."""
    batch = SearchBatch.of(batch)
    memory, src_mask = model.encode(batch.src)
    requests = [r for r in batch.requests for _ in range(copies)]
    B0, device = len(requests), batch.src.device
    s = settings
    max_len = [r.longest(s.max_len_a, s.max_len_b, s.limit) for r in requests]
    if sampling is not None:
        pick = Sampled.seeded(sampling, seeds, B0, max(max_len), device)
    if copies > 1 and pick is None:
        raise ValueError("copies of a sentence need a pick or sampling")
    alive = list(range(0, B0, copies))  # the ids of the rows still decoded
    alive_t = torch.tensor(alive, device=device)
    cache = model.new_cache()
    last = batch.starts(model.specials.start)  # (B, 1 + n): the first step reads them all
    out = [Hypothesis([], 0.0, 0.0) for _ in range(B0)]
    ended = [False] * len(alive)  # rows that have ended, not yet out of the batch
    for t in range(max(max_len)):
        force = [rules.at_limit(t + 1, max_len[b]) for b in alive]
        if pick is None and model.capabilities.candidates:  # a shortlist's
            start = torch.zeros(len(alive), 1, device=device)
            top, _, best = _continuations(model, last, memory, src_mask, cache, force, start)
            tok, lp = best[:, 0], top[:, 0]
        else:
            lprobs = next_log_probs(model, last, memory, src_mask, cache, force)
            split = pick.branch(alive_t, t).tolist() if copies > 1 else []
            if any(split):  # the cache (keys and values of the encoder too) copied row by row
                alive, parents = _branch(split, alive, copies, out)
                ended = [ended[i] for i in parents]
                rows = torch.tensor(parents, device=device)
                alive_t, lprobs = torch.tensor(alive, device=device), lprobs[rows]
                src_mask = _keep_rows(cache, src_mask, rows)
            tok = lprobs.argmax(dim=-1) if pick is None else pick(lprobs, alive_t, t)
            lp = lprobs.gather(1, tok[:, None]).squeeze(1)
        keep = _extend(out, alive, ended, tok, lp)
        if not keep:
            break
        last = tok.unsqueeze(1)
        # ended rows leave the batch once they are a quarter of it: copying the cache
        # of every row at each step where one ends costs more than decoding a few more rows
        if (len(alive) - len(keep)) * COMPACT >= len(alive):
            rows = torch.tensor(keep, device=device)
            alive, alive_t, ended = [alive[i] for i in keep], alive_t[rows], [False] * len(keep)
            last, src_mask = last[rows], _keep_rows(cache, src_mask, rows)
        memory = None  # from now on the cache holds its keys/values
    return out


@dataclass
class Candidates:
    """One step's candidates of each sentence (each (B, M)): their cumulative scores, the beam
    each continues and its token; under constraints also each one's bank, whether it may
    become a beam, and which constraints it has met (B, M, P) (decode/controlled.py)."""

    top: Tensor
    from_beam: Tensor
    tok: Tensor
    bank: Tensor | None = None
    usable: Tensor | None = None
    met: Tensor | None = None


class BeamStrategy(Protocol):
    """What beam search asks of a strategy at each step, each call given what it reads (no
    state passes between the calls of a step): the candidates, the next beams among them, how
    many constraints each of the first K lacks (None: none asked), and what the kept beams
    carry to the next step."""

    def candidates(
        self, model: Decodable, tokens: Tensor, memory, src_mask, cache, force: list[bool],
        scores: Tensor, t: int,
    ) -> Candidates: ...  # fmt: skip

    def select(self, c: Candidates, K: int) -> Tensor: ...

    def unmet(self, c: Candidates, K: int) -> Tensor | None: ...

    def advance(self, c: Candidates, keep: Tensor, sentences: Tensor | None) -> None: ...


class PlainBeam:
    """The beam search without controls: the best 2K continuations (`_continuations`), of
    which the best K that do not end continue (`rules.continuing`)."""

    def candidates(self, model, tokens, memory, src_mask, cache, force, scores, t) -> Candidates:
        last = tokens if t == 0 else tokens[:, -1:]  # the first step reads every start id
        return Candidates(*_continuations(model, last, memory, src_mask, cache, force, scores))

    def select(self, c: Candidates, K: int) -> Tensor:
        return rules.continuing(c.tok, K)

    def unmet(self, c: Candidates, K: int) -> None:
        return None

    def advance(self, c: Candidates, keep: Tensor, sentences: Tensor | None) -> None:
        return None


def note_finished(
    finished: list[list[Hypothesis]],
    alive: list[int],
    host: list[list[float]],
    rows: Tensor,
    tokens: Tensor,
    length: int,
    alpha: float,
    unmet: Callable[[], Tensor | None] = lambda: None,
) -> None:
    """Add to each live sentence's `finished` its candidates among the best K that finish
    (rules.finishing) at output `length`: `host` (B, K + 1) holds their log-probabilities (NaN
    for those that do not finish), `rows` (B, 2K) their beams' rows in `tokens` (B*K, t);
    `unmet()` (B, K) how many constraints each lacks (None: none), asked only when one
    finishes."""
    K = len(host[0]) - 1 if host else 0
    new = [(i, j) for i in range(len(alive)) for j in range(K) if host[i][j] > -torch.inf]
    if not new:  # NaN compares False: only finished hypotheses
        return
    ids = rows[[i for i, _ in new], [j for _, j in new]]
    lacking = unmet()
    unmet_host = lacking.tolist() if lacking is not None else None
    output = tokens[ids, tokens.size(1) - (length - 1) :]  # the last length - 1: no start ids
    for (i, j), hyp in zip(new, output.tolist()):
        log_prob = host[i][j]
        score = rules.finished_score(log_prob, length, alpha)
        lacks = unmet_host[i][j] if unmet_host is not None else 0
        finished[alive[i]].append(Hypothesis(hyp, score, log_prob, lacks))


def _to_host(top: Tensor, tok: Tensor, K: int) -> list[list[float]]:
    """One transfer to the host per step: (B, K + 1) the scores of the first K candidates
    where they finish (NaN where not), and each sentence's best live score."""
    ended = top[:, :K].masked_fill(~rules.finishing(top, tok, K), torch.nan)
    live_best = top.masked_fill(tok == EOS_ID, -torch.inf).max(dim=1).values
    return torch.cat([ended, live_best.unsqueeze(1)], 1).tolist()


@torch.inference_mode()
def beam_search(
    model: Decodable,
    batch: SearchBatch | Tensor | Groups,
    settings: SearchSettings = SearchSettings(),
    nbest: int = 1,
    strategy: BeamStrategy | None = None,
) -> list[list[Hypothesis]]:
    """The `nbest` (at most the beam) best hypotheses of each sentence of `batch` (B rows),
    best first, under `settings` (rules.py); `strategy` the candidates and their selection (None: `PlainBeam`; under the
    requests' controls, controlled.py's `ConstrainedBeam`)."""
    rules.check_stopping(settings.stopping)
    batch = SearchBatch.of(batch)
    src, K, alpha, stopping = batch.src, settings.beam, settings.alpha, settings.stopping
    B0, device, start = src.size(0), src.device, model.specials.start
    memory, src_mask = model.encode(src)  # one row per sentence, not per beam
    max_len = batch.max_lengths(settings.max_len_a, settings.max_len_b, settings.limit)
    alive, cache = list(range(B0)), model.new_cache()  # alive: each live sentence's index
    tokens = batch.starts(start).repeat_interleave(K, 0)  # (B*K, 1 + n + t)
    scores = rules.start_beams(torch.empty(B0, K, device=device))
    finished: list[list[Hypothesis]] = [[] for _ in range(B0)]
    strategy = strategy or PlainBeam()
    for t in range(max(max_len)):
        B = len(alive)
        force = [rules.at_limit(t + 1, max_len[b]) for b in alive for _ in range(K)]
        c = strategy.candidates(model, tokens, memory, src_mask, cache, force, scores, t)
        top, tok = c.top, c.tok
        rows = torch.arange(B, device=device).unsqueeze(1) * K + c.from_beam  # (B, M) flat rows
        host = _to_host(top, tok, K)
        note_finished(
            finished, alive, host, rows, tokens, t + 1, alpha, partial(strategy.unmet, c, K)
        )
        done = [
            rules.at_limit(t + 1, max_len[b])
            or rules.sentence_done(finished[b], host[i][K], max_len[b], K, nbest, alpha, stopping)
            for i, b in enumerate(alive)
        ]
        if all(done):
            break
        keep = strategy.select(c, K)  # (B, K): the next beams (the best K not ending in EOS)
        scores, rows, tok = top.gather(1, keep), rows.gather(1, keep), tok.gather(1, keep)
        sentences = None
        if any(done):  # finished sentences leave the batch
            live = [i for i in range(B) if not done[i]]
            sentences = torch.tensor(live, device=device)
            alive = [alive[i] for i in live]
            scores, rows, tok = scores[sentences], rows[sentences], tok[sentences]
            src_mask = None if src_mask is None else src_mask[sentences]
        strategy.advance(c, keep, sentences)
        rows = rows.view(-1)  # (B'*K,) rows of the previous step's hypotheses
        tokens = torch.cat([tokens[rows], tok.view(-1, 1)], 1)
        cache.reorder(rows)
        if sentences is not None:
            cache.select(sentences)
        memory = None  # from now on the cache holds its keys/values
    return [rules.best(f, nbest) for f in finished]
