"""Greedy and beam search over a model's `encode()` / `decode()` with a key/value cache.

Shape legend: B sentences still being decoded, K beam size, V vocabulary, t steps so far.

The model is anything with `encode(src) -> (memory, src_mask)`, `new_cache()`, and
`decode(last_tokens (N, 1), memory, src_mask, cache) -> logits (N, 1, V)`; the cache is a list
of dicts of tensors whose first dimension is the hypothesis.

Beam search (the paper's settings: K = 4, alpha = 0.6, max length = source length + 50):
each step `beam_step` picks the best 2K continuations of the K live hypotheses of every
sentence; those ending in EOS among the first K are finished hypotheses, scored by the
length penalty of Wu et al. (2016), lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| counting EOS; the
best K that do not end become the next beam. A sentence is done when it has K finished
hypotheses, and leaves the batch. At the maximum length only EOS is allowed, so every
sentence ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtx.model.transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, reorder_cache


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / length penalty


def length_penalty(length: int, alpha: float) -> float:
    """Wu et al. (2016): ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src: Tensor, a: float, b: int, limit: int) -> Tensor:
    """(B,) longest output per sentence, EOS included: a * source tokens (EOS excluded) + b."""
    src_len = (src != PAD_ID).sum(1) - 1
    return (a * src_len.float() + b).long().clamp(min=1, max=limit)


def _log_probs(model, tokens: Tensor, memory, src_mask, cache, force_eos: Tensor) -> Tensor:
    """(N, V) next-token log-probabilities; PAD, BOS and UNK never, EOS only where forced."""
    logits = model.decode(tokens[:, -1:], memory, src_mask, cache)[:, -1].float()  # (N, V)
    lprobs = torch.log_softmax(logits, dim=-1)
    lprobs[:, [PAD_ID, BOS_ID, UNK_ID]] = -torch.inf
    eos = lprobs[:, EOS_ID].clone()
    lprobs[force_eos] = -torch.inf
    lprobs[:, EOS_ID] = eos
    return lprobs


@torch.no_grad()
def greedy_search(
    model, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50, limit: int = 1024
) -> list[Hypothesis]:
    """Pick the most probable token at every step; returns one hypothesis per sentence."""
    B = src.size(0)
    memory, src_mask = model.encode(src)
    max_len = max_lengths(src, max_len_a, max_len_b, limit)
    cache = model.new_cache()
    tokens = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)
    score = torch.zeros(B, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for t in range(int(max_len.max())):
        lprobs = _log_probs(model, tokens, memory, src_mask, cache, t + 1 >= max_len)
        best, tok = lprobs.max(dim=-1)
        score = score + best.masked_fill(done, 0.0)
        tok = tok.masked_fill(done, PAD_ID)
        tokens = torch.cat([tokens, tok[:, None]], 1)
        done = done | (tok == EOS_ID)
        if done.all():
            break
    out = []
    for row, s in zip(tokens[:, 1:].tolist(), score.tolist()):
        ids = row[: row.index(EOS_ID)] if EOS_ID in row else row
        out.append(Hypothesis(ids, s))
    return out


def beam_step(scores: Tensor, lprobs: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
    """scores (B, K) of live beams, lprobs (B*K, V) -> the best 2K candidates of each sentence:
    cumulative scores, source beam and token, each (B, 2K), best first."""
    B, V = scores.size(0), lprobs.size(-1)
    cand = (scores.unsqueeze(-1) + lprobs.view(B, K, V)).view(B, K * V)
    top, idx = cand.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
    return top, idx // V, idx % V


@torch.no_grad()
def beam_search(
    model,
    src: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    limit: int = 1024,
    nbest: int = 1,
) -> list[list[Hypothesis]]:
    """The `nbest` (at most `beam`) best hypotheses of each sentence of `src` (B, S), best first."""
    K, B0, device = beam, src.size(0), src.device
    memory, src_mask = model.encode(src)
    memory, src_mask = memory.repeat_interleave(K, 0), src_mask.repeat_interleave(K, 0)
    max_len = max_lengths(src, max_len_a, max_len_b, limit)  # (B,)
    alive = torch.arange(B0, device=device)  # original index of each sentence still decoded
    cache = model.new_cache()
    tokens = torch.full((B0 * K, 1), BOS_ID, dtype=torch.long, device=device)  # (B*K, t)
    scores = torch.full((B0, K), -torch.inf, device=device)
    scores[:, 0] = 0.0  # all beams start equal: let only the first one expand at step 1
    finished: list[list[Hypothesis]] = [[] for _ in range(B0)]
    for t in range(int(max_len.max())):
        B = alive.numel()
        force_eos = (t + 1 >= max_len).repeat_interleave(K)
        lprobs = _log_probs(model, tokens, memory, src_mask, cache, force_eos)
        top, from_beam, tok = beam_step(scores, lprobs, K)
        rows = torch.arange(B, device=device).unsqueeze(1) * K + from_beam  # (B, 2K) flat rows
        # Candidates ending in EOS within the first K become finished hypotheses.
        ends = (tok == EOS_ID) & torch.isfinite(top)
        ends[:, K:] = False
        for b, j in ends.nonzero().tolist():
            hyp = tokens[rows[b, j], 1:].tolist()
            finished[alive[b]].append(
                Hypothesis(hyp, top[b, j].item() / length_penalty(t + 1, alpha))
            )
        # Sentences with K finished hypotheses leave the batch.
        done = torch.tensor([len(finished[i]) >= K for i in alive.tolist()], device=device)
        if done.all():
            break
        # The best K candidates not ending in EOS continue.
        order = (tok == EOS_ID).long() * (2 * K) + torch.arange(tok.size(1), device=device)
        keep = order.argsort(dim=1)[:, :K]  # (B, K)
        scores, rows, tok = top.gather(1, keep), rows.gather(1, keep), tok.gather(1, keep)
        if done.any():
            live = (~done).nonzero().squeeze(1)  # (B',)
            alive, max_len, scores, rows, tok = (
                x[live] for x in (alive, max_len, scores, rows, tok)
            )
            live_rows = (live.unsqueeze(1) * K + torch.arange(K, device=device)).view(-1)
            memory, src_mask = memory[live_rows], src_mask[live_rows]
        rows = rows.view(-1)  # (B'*K,) rows of the previous step's hypotheses
        tokens = torch.cat([tokens[rows], tok.view(-1, 1)], 1)
        cache = reorder_cache(cache, rows)
    return [sorted(f, key=lambda h: -h.score)[:nbest] for f in finished]
