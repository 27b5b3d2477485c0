"""Beam search under a sentence's controls: a target prefix, hard constraints, avoided phrases.

A request (request.py) may carry, as target ids, a prefix its output starts with, constraints
(phrases its output must contain) and phrases to avoid. The beam search of search.py decodes
such requests with `ConstrainedBeam` as its strategy, which adds to each step (each rule written in rules.py):

- the prefix: at step t < len(prefix) only prefix[t] may come (`rules.force_tokens`); its
  log-probability counts, so an output is ranked by the log-probability of all of it;
- the avoided phrases: a token that would complete one is ruled out (`rules.ban`);
- the constraints, by dynamic beam allocation (Post and Vilar 2018) vectorised over the batch
  as Hu et al. (2019) do: besides the best 2K continuations, each beam proposes the next token
  of every constraint it has not met and its own best token; a candidate's bank is the number
  of constraint tokens it has met (all those of the constraints its output contains, plus the
  longest beginning of an unmet one that its output ends with), and `rules.allocate` deals the
  K beams among the banks. A hypothesis may not end while a constraint is unmet
  (`rules.block_eos`), unless at its longest output, where it ends and ranks after every
  hypothesis that met them all (`rules.best`), its `unmet` saying how many it lacks.

A constraint is met once the output contains its ids, consecutively, anywhere (in the prefix
too). How far a hypothesis has come in each constraint is read from its last tokens at every
step (`matched`: the longest beginning of the phrase that the output ends with), so a
constraint begun, broken off and begun again, or constraints that share their first tokens, are
followed exactly, as a trie of the constraints would follow them.

Alternatives (a request's `alternatives`: K) are the K most probable words after the prefix,
each continued greedily on its own to a full translation, decoded by greedy search (search.py)
with `Alternatives` as its pick: the sentence is one row while it follows its prefix, becomes K
rows where the prefix ends (they take the K best tokens there, EOS not among them), and each
then takes its own best token until it ends. The decoder reads the prefix once and each
alternative for its own length: fewer rows than a beam-K search with the prefix (whose K beams
all run until the sentence is done), though a greedy continuation that repeats itself runs to
the longest output, on a few rows.

What is guaranteed: when the prefix, the constraints' tokens and EOS fit in a sentence's longest
output, every output contains every constraint. The hypothesis that has met most keeps a beam
at every step (`rules.allocate`), and its candidate that continues its longest unmet beginning
meets one more token, so it has met them all after at most that many steps; from then on it
or a descendant keeps a beam until one ends, at the latest at the longest output.

Nothing is read across sentences: every tensor has a row per sentence or per beam, so a
sentence's output depends on its own request alone, in any batch.

Shape legend: B sentences still decoded, K beams, N = B * K rows, V vocabulary, P constraints
(the most of any sentence), A avoided phrases, L the longest phrase, M candidates a sentence.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from mtx.decode import rules
from mtx.decode.request import Request
from mtx.decode.search import Candidates, next_log_probs
from mtx.tokens import EOS_ID

NONE = -1  # the padding of phrases: never a token
BEFORE = -2  # what a row's window holds before its first output token
WORD_END = -3  # after a constraint: the next token must end its word (`word_ends`)
WORD_CHAR = re.compile(r"\w")


def _padded(seqs: list[tuple[int, ...]], width: int, device: torch.device) -> Tensor:
    """(len(seqs), width) ids, each row padded with NONE."""
    out = torch.full((len(seqs), max(width, 1)), NONE, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)


def _phrases(lists: list[tuple[tuple[int, ...], ...]], device) -> tuple[Tensor, Tensor]:
    """Each sentence's phrases as ids (B, P, L) padded with NONE, and their lengths (B, P)
    (0 where a sentence has fewer than P)."""
    P = max((len(x) for x in lists), default=0)
    L = max((len(p) for x in lists for p in x), default=1)
    ids = torch.full((len(lists), P, L), NONE, dtype=torch.long)
    lengths = torch.zeros(len(lists), P, dtype=torch.long)
    for i, phrases in enumerate(lists):
        for j, phrase in enumerate(phrases):
            ids[i, j, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
            lengths[i, j] = len(phrase)
    return ids.to(device), lengths.to(device)


def matched(window: Tensor, phrases: Tensor, ends: Tensor | None = None) -> Tensor:
    """How far each of R rows has come in each of its phrases: `window` (R, W) its last W
    output tokens (BEFORE where it has fewer), `phrases` (R, Q, L) -> (R, Q) the length of the
    longest beginning of the phrase that the output ends with (the phrase's length: it ends
    with the whole phrase). A WORD_END in a phrase matches a token that `ends` ((V,) bool)
    says ends a word."""
    R, Q, L = phrases.shape
    W = window.size(1)
    ending = None if ends is None else ends[window.clamp(min=0)] & (window >= 0)
    out = torch.zeros(R, Q, dtype=torch.long, device=window.device)
    for p in range(1, min(L, W) + 1):
        same = window[:, None, W - p :] == phrases[:, :, :p]  # NONE matches nothing
        if ending is not None:
            same |= (phrases[:, :, :p] == WORD_END) & ending[:, None, W - p :]
        out = torch.where(same.all(-1), p, out)
    return out


def banned(lprobs: Tensor, window: Tensor, avoid: Tensor, lengths: Tensor) -> Tensor:
    """`lprobs` (R, V) with each token ruled out that would complete a phrase to avoid: rows
    whose last tokens `window` (R, W) are all but the last of one of their `avoid` (R, A, L)
    (`lengths` (R, A), 0 where a row has fewer) may not take its last (`rules.ban`)."""
    at = matched(window, avoid)
    last = avoid.gather(2, (lengths - 1).clamp(min=0).unsqueeze(2)).squeeze(2)  # (R, A)
    rows, which = ((at == lengths - 1) & (lengths > 0)).nonzero(as_tuple=True)
    return rules.ban(lprobs, rows, last[rows, which])


def word_ends(vocab, device: torch.device) -> Tensor:
    """(V,) bool: the tokens that do not continue the word before them, so that it has ended:
    EOS, the pieces that begin a word (SentencePiece's "▁" first) and those whose first
    character is not a word character (punctuation), as controls.py's words are split."""
    ends = torch.zeros(vocab.get_piece_size(), dtype=torch.bool)
    for i in range(len(ends)):
        piece = vocab.id_to_piece(i)
        ends[i] = not piece or piece[0] == "▁" or not WORD_CHAR.match(piece[0])
    ends[EOS_ID] = True
    return ends.to(device)


class ConstrainedBeam:
    """Beam search's strategy (search.py's `BeamStrategy`) under a batch's controls: the
    controls of each sentence, and what each beam has met of its constraints, the one state
    kept from step to step (`advance`); each step's candidates carry their own (see the
    module's docstring)."""

    def __init__(
        self,
        requests: list[Request],
        K: int,
        device: torch.device,
        ends: Tensor | None = None,
    ) -> None:
        """`ends`: the tokens that end a word (`word_ends`): then a constraint counts only
        where its last word ends, and the token after a prefix begins a word; None: ids
        alone."""
        self.K, self.ends = K, ends
        self.output_from = 1 + len(requests[0].start)  # a row's first output column
        longest = max(len(r.controls.prefix) for r in requests)
        self.prefix = _padded([r.controls.prefix for r in requests], longest, device)
        self.prefix_len = torch.tensor([len(r.controls.prefix) for r in requests], device=device)
        close = () if ends is None else (WORD_END,)
        need = [tuple((*c, *close) for c in r.controls.constraints) for r in requests]
        self.need, self.need_len = _phrases(need, device)
        self.avoid, self.avoid_len = _phrases([r.controls.avoid for r in requests], device)
        self.W = max(self.need.size(2), self.avoid.size(2), 1)  # the window a step reads
        self.met = (self.need_len == 0).repeat_interleave(K, 0)  # (N, P): no phrase is met

    @property
    def constraints(self) -> int:
        return self.need.size(1)

    def window(self, tokens: Tensor) -> Tensor:
        """(N, W) the last W output tokens of each row of `tokens` (N, the start token and
        the request's start ids, then the output), BEFORE where it has fewer."""
        out = tokens[:, self.output_from :][:, -self.W :]
        if out.size(1) < self.W:
            before = out.new_full((out.size(0), self.W - out.size(1)), BEFORE)
            out = torch.cat([before, out], 1)
        return out

    def candidates(
        self, model, tokens, memory, src_mask, cache, force: list[bool], scores: Tensor, t: int
    ) -> Candidates:
        """Step t's candidates of each sentence under its controls (`mask`, `propose`)."""
        last = tokens if t == 0 else tokens[:, -1:]  # the first step reads every start id
        lprobs = next_log_probs(model, last, memory, src_mask, cache, force)
        window = self.window(tokens)
        at_limit = torch.tensor(force, device=tokens.device)
        lprobs, at = self.mask(lprobs, window, t, at_limit)
        return self.propose(scores, lprobs, window, at)

    def mask(
        self, lprobs: Tensor, window: Tensor, t: int, force: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """(N, V) log-probabilities at step t under the rows' controls (`force` (N,) bool: the
        rows at their longest output), and (N, P) how far each row has come in each
        constraint (`matched`; None without constraints)."""
        K = self.K
        if t < self.prefix.size(1):
            forced = torch.where(t < self.prefix_len, self.prefix[:, t], NONE)
            lprobs = rules.force_tokens(lprobs, forced.repeat_interleave(K))
        if self.ends is not None and t <= self.prefix.size(1):
            after = ((self.prefix_len == t) & (t > 0)).repeat_interleave(K)
            lprobs = rules.only_tokens(lprobs, after, self.ends)
        if self.avoid.size(1):
            avoid = self.avoid.repeat_interleave(K, 0), self.avoid_len.repeat_interleave(K, 0)
            lprobs = banned(lprobs, window, *avoid)
        if not self.constraints:
            return lprobs, None
        need, lengths = self.need.repeat_interleave(K, 0), self.need_len.repeat_interleave(K, 0)
        at = matched(window, need, self.ends)
        # EOS ends a word: it may close a constraint that only waits for its word's end
        waiting = at == lengths - 1 if self.ends is not None else torch.zeros_like(self.met)
        lprobs = rules.block_eos(lprobs, ~(self.met | waiting).all(1) & ~force)
        return lprobs, at

    def propose(
        self, scores: Tensor, lprobs: Tensor, window: Tensor, at: Tensor | None
    ) -> Candidates:
        """The candidates of each sentence (each (B, M)): the best 2K continuations
        (`rules.top_candidates`), then, with constraints, each beam's next token of every
        constraint it has not met and its own best token (candidates already among the others
        are not usable), with their banks. With constraints, the K that `rules.allocate` deals
        beams to when EOS may take one come first, so that those of them ending in EOS finish
        (`rules.finishing`): a hypothesis that has met every constraint may end even when its
        score is not among the best K. Without, the best K come first, as in the plain beam
        search."""
        B, K, P = scores.size(0), self.K, self.constraints
        top, from_beam, tok = rules.top_candidates(scores, lprobs, K)
        if P:
            top, from_beam, tok, proposed = self._proposed(scores, lprobs, at, top, from_beam, tok)
        else:
            proposed = torch.ones_like(tok, dtype=torch.bool)
        usable = proposed & (tok != EOS_ID)
        rows = torch.arange(B, device=tok.device).unsqueeze(1) * K + from_beam  # (B, M)
        met = self.met[rows.view(-1)]  # (B * M, P)
        if P:
            M = tok.size(1)
            after = torch.cat([window[rows.view(-1), 1:], tok.view(-1, 1)], 1)
            lengths = self.need_len.repeat_interleave(M, 0)
            reached = matched(after, self.need.repeat_interleave(M, 0), self.ends)
            met = met | ((reached == lengths) & (lengths > 0))
            progress = reached.masked_fill(met, 0).max(1).values
            bank = ((lengths * met).sum(1) + progress).view(B, M)
        else:
            bank = torch.zeros_like(tok)
        met = met.view(B, tok.size(1), P)
        c = Candidates(top, from_beam, tok, bank, usable, met)
        return self._allocated_first(c, proposed) if P else c

    def _allocated_first(self, c: Candidates, proposed: Tensor) -> Candidates:
        """`c` reordered: the candidates dealt beams with EOS among them first, so that those
        ending finish."""
        K, (B, M) = self.K, c.tok.shape
        first = rules.allocate(c.top, c.bank, proposed, K)
        key = torch.arange(M, device=c.tok.device).add(K).expand(B, M).clone()
        key.scatter_(1, first, torch.arange(K, device=c.tok.device).expand(B, K))
        order = key.argsort(dim=1)
        P = c.met.size(2)
        return Candidates(
            c.top.gather(1, order),
            c.from_beam.gather(1, order),
            c.tok.gather(1, order),
            c.bank.gather(1, order),
            c.usable.gather(1, order),
            c.met.gather(1, order.unsqueeze(2).expand(-1, -1, P)),
        )

    def _proposed(self, scores, lprobs, at, top, from_beam, tok):
        """`propose`'s proposals appended to the best 2K, and which candidates are usable."""
        B, K, V = scores.size(0), self.K, lprobs.size(1)
        need = self.need.repeat_interleave(K, 0)  # (N, P, L); `at` (N, P)
        nxt = need.gather(2, at.clamp(max=need.size(2) - 1).unsqueeze(2)).squeeze(2)  # (N, P)
        if self.ends is not None:  # a word's end: the row's best token that ends a word
            waiting = nxt == WORD_END
            rows = waiting.any(1).nonzero().squeeze(1)  # read only the rows that wait for one
            if rows.numel():
                ends = lprobs[rows].masked_fill_(~self.ends, -torch.inf).argmax(1, keepdim=True)
                nxt[rows] = torch.where(waiting[rows], ends, nxt[rows])
        ok = torch.cat([~self.met, torch.ones_like(self.met[:, :1])], 1)  # (N, P + 1)
        extra = torch.cat([nxt.masked_fill(~ok[:, :-1], 0), lprobs.argmax(1, keepdim=True)], 1)
        extra_scores = scores.view(-1, 1) + lprobs.gather(1, extra)  # (N, P + 1)
        E = extra.size(1)
        beams = torch.arange(K, device=tok.device).repeat_interleave(E).expand(B, K * E)
        extra, ok = extra.view(B, K * E), ok.view(B, K * E)
        key, key_top = beams * V + extra, from_beam * V + tok
        again = (key.unsqueeze(2) == key_top.unsqueeze(1)).any(2)
        earlier = torch.ones(K * E, K * E, dtype=torch.bool, device=tok.device).tril(-1)
        again |= ((key.unsqueeze(2) == key.unsqueeze(1)) & earlier).any(2)
        ok = ok & ~again
        extra_scores = extra_scores.view(B, K * E).masked_fill(~ok, -torch.inf)
        proposed = torch.cat([torch.ones_like(tok, dtype=torch.bool), ok], 1)
        return (
            torch.cat([top, extra_scores], 1),
            torch.cat([from_beam, beams], 1),
            torch.cat([tok, extra], 1),
            proposed,
        )

    def select(self, c: Candidates, K: int) -> Tensor:
        """(B, K) the candidates that become the next beams: dealt among the banks
        (`rules.allocate`) where the batch has constraints, else the plain search's
        (`rules.continuing`), which allocate's one bank equals."""
        if not self.constraints:
            return rules.continuing(c.tok, K)
        return rules.allocate(c.top, c.bank, c.usable, K)

    def unmet(self, c: Candidates, K: int) -> Tensor:
        """(B, K) how many constraints each of the best K candidates lacks (if it ends)."""
        return (~c.met[:, :K]).sum(2)

    def advance(self, c: Candidates, keep: Tensor, sentences: Tensor | None) -> None:
        """Keep what the next beams (`keep` (B, K) candidates) have met, and the sentences
        still decoded (`sentences`, None: all)."""
        met = c.met.gather(1, keep.unsqueeze(2).expand(-1, -1, self.constraints))
        if sentences is not None:
            met = met[sentences]
            self.prefix, self.prefix_len = self.prefix[sentences], self.prefix_len[sentences]
            self.need, self.need_len = self.need[sentences], self.need_len[sentences]
            self.avoid, self.avoid_len = self.avoid[sentences], self.avoid_len[sentences]
        self.met = met.reshape(met.size(0) * met.size(1), self.constraints)


class Alternatives:
    """greedy_search's `pick` (search.py) for requests asking for K alternatives, decoded with
    `copies` K (row r is alternative r % K of sentence r // K): every row follows its
    sentence's prefix, row r then takes the (r % K + 1)-th most probable token after it (never
    EOS; with `ends`, a token that begins a word, as `ConstrainedBeam` rules after a prefix), and from
    then on its own most probable one; the phrases to avoid are banned throughout. Each row
    ends on its own, so an alternative costs the steps of its own output. `branch` only
    answers (it changes nothing), so the two methods hold no contract of call order: each
    row's window of last tokens (for the phrases to avoid) is kept by `__call__` alone, a copy
    taking its sentence's where the prefix ends."""

    def __init__(
        self, requests: list[Request], K: int, device: torch.device, ends: Tensor | None = None
    ) -> None:
        rows = [r for r in requests for _ in range(K)]
        self.K, self.ends = K, ends
        self.prefix = _padded(
            [r.controls.prefix for r in rows], max(len(r.controls.prefix) for r in rows), device
        )
        self.prefix_len = torch.tensor([len(r.controls.prefix) for r in rows], device=device)
        self.rank = torch.arange(len(rows), device=device).remainder(K).unsqueeze(1)  # (R, 1)
        self.avoid, self.avoid_len = _phrases([r.controls.avoid for r in rows], device)
        self.window = None  # (R, W) each row's last output tokens, where a phrase is avoided
        if self.avoid.size(1):
            self.window = torch.full((len(rows), self.avoid.size(2)), BEFORE, device=device)

    def branch(self, rows: Tensor, t: int) -> Tensor:
        """The rows whose prefix ends at step t: there they become the K alternatives."""
        return self.prefix_len[rows] == t

    def __call__(self, lprobs: Tensor, rows: Tensor, t: int) -> Tensor:
        """The rows' tokens at step t, by the rules of rules.py: avoided phrases banned
        (`rules.ban`), the prefix forced (`rules.take_forced`), and where it ends the
        (r % K + 1)-th best token that does not end the output (`rules.block_eos`) and, with
        `ends`, begins a word (`rules.only_tokens`); else the most probable one."""
        P = self.prefix.size(1)
        if self.window is not None:
            if t <= P:  # a copy begins with its sentence's window where the prefix ends
                rank = self.rank[rows].squeeze(1)
                copies = rows[(self.prefix_len[rows] == t) & (rank > 0)]
                self.window[copies] = self.window[copies - self.rank[copies].squeeze(1)]
            window = self.window[rows]
            lprobs = banned(lprobs, window, self.avoid[rows], self.avoid_len[rows])
        if t > P:  # every row is past its prefix: its own best token
            tok = lprobs.argmax(1)
        else:
            n = self.prefix_len[rows]
            tok = lprobs.argmax(1)
            if t < P:
                tok = rules.take_forced(tok, torch.where(t < n, self.prefix[rows, t], NONE))
            at = (n == t).nonzero().squeeze(1)  # the rows that branch now
            if at.numel():
                every = torch.ones_like(at, dtype=torch.bool)
                free = rules.block_eos(lprobs[at], every)
                if self.ends is not None and t > 0:
                    free = rules.only_tokens(free, every, self.ends)
                ranked = free.topk(self.K, dim=1).indices.gather(1, self.rank[rows[at]])
                tok[at] = ranked.squeeze(1)
        if self.window is not None:
            self.window[rows] = torch.cat([window[:, 1:], tok.unsqueeze(1)], 1)
        return tok
