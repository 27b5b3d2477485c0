"""Beam search and greedy search over fixed rows and a static cache: what a CUDA graph replays.

Shape legend: B sentences (padded up to a bucket), K beam size (1: greedy), N = B * K rows,
L the longest output, V vocabulary.

The search of search.py shrinks as sentences end and grows its cache by one position a step:
every step has new shapes, and at small batches a step is a few hundred small kernels that
the host launches one by one. Here nothing changes shape during a search:

- the rows are fixed: the sentences of a batch padded up to a power of two (`rows_bucket`),
  each with K beams; a padding sentence is an empty source allowed one step;
- the self-attention keys and values live in a cache allocated for L positions (the longest
  output the source's padded length allows) and written in place at the step's position
  (model/cache.py's StaticCache); a step attends over a window of it, the positions
  not yet written masked; the encoder output's keys and values are computed once;
- finished hypotheses are masked, not removed: a sentence that is done adds nothing more,
  and its rows go on computing what nobody reads;
- the beam bookkeeping stays on the device: up to 2K finished hypotheses per sentence (K can
  end at the step that completes the K-th) in preallocated slots, with their log-probability
  and length; the host reads the done flags every `check_every` steps.

A step reads the cache's first positions only, up to its position rounded up to a multiple of
16 (StaticCache's window): attending over, and reordering, all L positions at every step cost
the CPU most of its time. On CUDA, with `graphs`, the step is captured once per (rows, source
length, beam, window) as a CUDA graph and replayed: one launch a step (`Graphs`). On the CPU
the same step runs as it is.

It finds what search.py's beam search finds with `stopping: k_finished` (and its greedy
search): both follow the rules of rules.py (the longest output, the tokens never produced,
the candidates that finish and those that continue, the score and the ranking), so the same
candidates, the same finished hypotheses in the same order, scored on the host by the same
formula. The numbers differ only where attention sums over a window of
positions, some of them masked, instead of the t written so far, which rounds differently: a near-tie between
two hypotheses may then go the other way (tests/test_static.py counts them on test2016). With
`full=False` the step attends over the written positions only, as the growing cache does,
and the hypotheses are the same bit for bit (tested): the bookkeeping is exact.

A sentence's output does not depend on the other sentences of its batch or on its rows
bucket: L depends on its padded source length alone, the window on the step alone, and every
row is computed alone (model/rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtx.decode import rules
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis, SearchSettings
from mtx.model.cache import StaticCache
from mtx.model.interface import Decodable
from mtx.tokens import EOS_ID, PAD_ID


def rows_bucket(sentences: int) -> int:
    """The number of sentence rows a batch of `sentences` is padded up to: a power of two."""
    return 1 << max(sentences - 1, 0).bit_length()


@dataclass
class State:
    """Everything a search changes, on the device, allocated once per shape."""

    src_mask: Tensor  # (B, 1, S) True on real source tokens
    max_len: Tensor  # (B,) longest output per sentence, EOS included
    last: Tensor  # (N, 1) the tokens decoded at the last step
    tokens: Tensor  # (N, L + 1) BOS, then each row's output so far
    scores: Tensor  # (B, K) cumulative log-probabilities of the live beams
    step_logp: Tensor  # (B, L) greedy: each step's log-probability
    done: Tensor  # (B,) bool
    n_fin: Tensor  # (B,) finished hypotheses so far
    fin_logp: Tensor  # (B, 2K + 1) their log-probabilities; slot 2K takes what is dropped
    fin_len: Tensor  # (B, 2K + 1) their lengths, EOS included
    fin_tokens: Tensor  # (B, 2K + 1, L) their tokens
    cache: StaticCache  # the model's


class StaticSearch:
    def __init__(
        self,
        model: Decodable,
        settings: SearchSettings = SearchSettings(),
        graphs: bool = False,
        full: bool = True,
        check_every: int = 4,
    ) -> None:
        if not model.capabilities.static_cache:
            raise ValueError(f"{type(model).__name__} has no static cache")
        if graphs and not full:
            raise ValueError("a CUDA graph needs the full cache (full=True)")
        self.model, self.K, self.alpha = model, settings.beam, settings.alpha
        self.a, self.b, self.limit = settings.max_len_a, settings.max_len_b, settings.limit
        self.full, self.check_every = full, check_every
        self.graphs = Graphs() if graphs else None

    def longest(self, src_len: Tensor | int) -> Tensor | int:
        """The longest output (EOS included) of a source of `src_len` tokens (EOS excluded)."""
        return rules.max_lengths(src_len, self.a, self.b, self.limit)

    @torch.inference_mode()
    def __call__(self, batch: SearchBatch | Tensor, nbest: int = 1) -> list[list[Hypothesis]]:
        """The `nbest` best hypotheses of each sentence of `batch` (B rows of one padded
        length), best first."""
        batch = SearchBatch.of(batch)
        src, B = batch.src, batch.src.size(0)
        rows = rows_bucket(B)
        src = torch.cat([src, empty_sources(rows - B, src.size(1), src.device)])
        memory, src_mask = self.model.encode(src)
        mine = batch.max_lengths(self.a, self.b, self.limit)
        max_len = torch.tensor(mine + [1] * (rows - B), device=src.device)  # padding: 1 step
        steps = int(max_len.max())
        # the cache's length: the padded source's longest output, or a request's own if longer
        L = max(self.longest(src.size(1) - 1), *mine)
        key = (rows, src.size(1), self.K, memory.dtype, L)  # a State (and graphs) per shape
        state = self.graphs.state(key) if self.graphs else None
        if state is None:
            state = self.new_state(rows, L, memory)
        self.reset(state, memory, src_mask, max_len)
        if self.graphs:
            self.graphs.run(key, state, self.step, steps, self.check_every)
        else:
            for t in range(steps):
                self.step(state, t)
                if (t + 1) % self.check_every == 0 and bool(state.done.all()):
                    break
        return self.hypotheses(state, B, nbest)

    def new_state(self, rows: int, L: int, memory: Tensor) -> State:
        K, device = self.K, memory.device

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        return State(
            src_mask=zeros(rows, 1, memory.size(1), dtype=torch.bool),
            max_len=zeros(rows),
            last=zeros(rows * K, 1),
            tokens=zeros(rows * K, L + 1),
            scores=zeros(rows, K, dtype=torch.float32),
            step_logp=zeros(rows, L, dtype=torch.float32),
            done=zeros(rows, dtype=torch.bool),
            n_fin=zeros(rows),
            fin_logp=zeros(rows, 2 * K + 1, dtype=torch.float32),
            fin_len=zeros(rows, 2 * K + 1),
            fin_tokens=zeros(rows, 2 * K + 1, L),
            cache=self.model.new_static_cache(rows * K, L, self.full, memory),
        )

    def reset(self, s: State, memory: Tensor, src_mask: Tensor, max_len: Tensor) -> None:
        """A new search in `s`, in place (a captured graph reads these very tensors)."""
        s.src_mask.copy_(src_mask)
        s.max_len.copy_(max_len)
        s.last.fill_(self.model.specials.start)
        s.tokens.fill_(self.model.specials.start)
        rules.start_beams(s.scores)
        for t in (s.step_logp, s.done, s.n_fin, s.fin_logp, s.fin_len):
            t.zero_()
        s.cache.restart()
        self.model.fill_memory(s.cache, memory)

    def step(self, s: State, t: int) -> None:
        """Decode position `t` for every row. A CUDA graph of it replays for every later
        position of the same window (the cache's: what the step reads is the same)."""
        s.cache.start(t)
        out = self.model.decode(s.last, None, s.src_mask, s.cache)[:, -1].float()
        lprobs = rules.mask_never_produced(torch.log_softmax(out, dim=-1), self.model.specials)
        length = s.cache.position + 1  # of an output that ends now, EOS included
        forced = rules.at_limit(length, s.max_len).repeat_interleave(self.K)
        lprobs = rules.only_eos(lprobs, forced)
        if self.K == 1:
            self.greedy_step(s, lprobs, length)
        else:
            self.beam_step(s, lprobs, length)
        s.cache.advance()

    def greedy_step(self, s: State, lprobs: Tensor, length: Tensor) -> None:
        tok = lprobs.argmax(dim=-1)  # (B,)
        live = ~s.done
        logp = lprobs.gather(1, tok[:, None]).masked_fill(~live[:, None], 0.0)
        s.step_logp.index_copy_(1, s.cache.position.view(1), logp)
        ended = live & (tok == EOS_ID)
        s.fin_len[:, 0] = torch.where(ended, length, s.fin_len[:, 0])
        s.done |= ended
        s.tokens.index_copy_(1, length.view(1), tok[:, None])
        s.last.copy_(tok[:, None])

    def beam_step(self, s: State, lprobs: Tensor, length: Tensor) -> None:
        K, B = self.K, s.scores.size(0)
        top, from_beam, tok = rules.top_candidates(s.scores, lprobs, K)  # (B, 2K) each
        rows = torch.arange(B, device=top.device).unsqueeze(1) * K + from_beam
        # The candidates that finish go into each sentence's next free slots (slot 2K, never
        # read, takes those of sentences already done).
        new = rules.finishing(top, tok, K) & ~s.done.unsqueeze(1)
        slot = s.n_fin.unsqueeze(1) + new.long().cumsum(1) - 1
        slot = torch.where(new, slot, 2 * K)
        s.fin_logp.scatter_(1, slot, top[:, :K])
        s.fin_len.scatter_(1, slot, length.expand(B, K))
        prefix = s.tokens.index_select(0, rows[:, :K].reshape(-1))[:, 1:]  # (B * K, L)
        index = slot.unsqueeze(2).expand(-1, -1, prefix.size(1))
        s.fin_tokens.scatter_(1, index, prefix.reshape(B, K, -1))
        s.n_fin += new.sum(1)
        s.done |= rules.enough_finished(s.n_fin, K) | rules.at_limit(length, s.max_len)
        keep = rules.continuing(tok, K)  # (B, K): the best K not ending in EOS
        s.scores.copy_(top.gather(1, keep))
        rows, tok = rows.gather(1, keep).view(-1), tok.gather(1, keep).view(-1, 1)
        s.tokens.copy_(s.tokens.index_select(0, rows))
        s.tokens.index_copy_(1, length.view(1), tok)
        s.cache.reorder(rows)
        s.last.copy_(tok)

    def hypotheses(self, s: State, B: int, nbest: int) -> list[list[Hypothesis]]:
        """Each real sentence's finished hypotheses, scored on the host as search.py scores
        them (log P / lp(length) in double precision), best first (ties: in finishing order)."""
        fin_len = s.fin_len[:B].tolist()
        if self.K == 1:
            tokens, logp = s.tokens[:B, 1:].tolist(), s.step_logp[:B].tolist()
            out = []
            for row, n, lp in zip(tokens, fin_len, logp):
                log_prob = 0.0
                for value in lp[: n[0]]:  # summed in order, as search.py does
                    log_prob += value
                out.append([Hypothesis(row[: n[0] - 1], log_prob, log_prob)])
            return out
        n_fin = s.n_fin[:B].clamp(max=2 * self.K).tolist()
        fin_logp, fin_tokens = s.fin_logp[:B].tolist(), s.fin_tokens[:B].tolist()
        out = []
        for i in range(B):
            hyps = [
                Hypothesis(
                    fin_tokens[i][j][: fin_len[i][j] - 1],
                    rules.finished_score(fin_logp[i][j], fin_len[i][j], self.alpha),
                    fin_logp[i][j],
                )
                for j in range(n_fin[i])
            ]
            out.append(rules.best(hyps, nbest))
        return out


def empty_sources(n: int, width: int, device: torch.device) -> Tensor:
    """`n` padding sentences: EOS, then padding."""
    out = torch.full((n, width), PAD_ID, dtype=torch.long, device=device)
    out[:, 0] = EOS_ID
    return out


class Graphs:
    """CUDA graphs of a search step, one per shape (rows, source length, beam, dtype, cache
    length) and window of the cache, each with the State it reads and writes: a later search of
    that shape copies its inputs into the State and replays. Their intermediate tensors share
    one memory pool (graphs replay one at a time); each State stays allocated while its graph
    is kept."""

    def __init__(self) -> None:
        self.captured: dict[tuple, tuple[State, torch.cuda.CUDAGraph]] = {}
        self.pool = None  # one memory pool for every graph: they never replay at once

    def state(self, key: tuple) -> State | None:
        """The State of shape `key`, if a graph of it was captured."""
        return next((v[0] for k, v in self.captured.items() if k[:-1] == key), None)

    def run(self, key: tuple, state: State, step, steps: int, check_every: int) -> None:
        """`steps` steps of `state`'s search: for each window of the cache, the graph of that
        (shape, window), captured the first time: a real step on a side stream, then the
        capture (which runs nothing)."""
        t = 0
        while t < steps:
            window = (*key, state.cache.window(t))
            if window in self.captured:
                self.captured[window][1].replay()
            else:
                self.capture(window, state, step, t)
            t += 1
            if t % check_every == 0 and bool(state.done.all()):
                break

    def capture(self, key: tuple, state: State, step, t: int) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(state, t)  # the real step t
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):  # records a step, reading the position
            step(state, t)  # on the device when replayed: any position of this window
        self.captured[key] = (state, graph)
