"""Forced decoding: the log-probability a model (or an ensemble) gives a target sentence.

    scorer = Scorer(Translator.from_checkpoints("runs/multi30k/checkpoints/best.pt").parts)
    scorer.score(["A man rides a bike."], ["Ein Mann fährt Fahrrad."])  # [Score(...)]

For each pair, log p(y | x) = sum_t log p(y_t | x, y_<t) over the target's subwords and EOS,
read from one forward pass of the decoder over the whole target (teacher forcing): no search,
so a batch costs about what one step of training does without the backward pass. An ensemble
scores with the log of the mean of its models' probabilities, as it translates
(ensemble.py).

A pair's score does not depend on the other pairs: each source is padded to a length of its
own and each target too (tokens.py's `padded_length`), a batch holds pairs of one (source,
target) padded shape only, so every pair is computed with the shapes it has alone, and the
sum over a target's tokens is taken on the host in float64, token by token in order. On the
CPU the model's products give each row the same numbers in any batch (model/rows.py,
model/packed.py), so a pair's score is the same alone and in any batch, bit for bit (tested);
on a GPU, as in translation, up to rounding.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from mtx.data.batching import pad
from mtx.decode.parts import Parts
from mtx.errors import MtxError
from mtx.tokens import padded_length

CHUNK = 20_000  # pairs `cross_entropies` scores at a time


@dataclass
class Score:
    """What a model gives one (source, target) pair."""

    total: float  # log p(target | source), natural log, EOS included
    tokens: int  # target tokens scored: its subwords and EOS
    per_token: list[float]  # log p of each target token, in order

    @property
    def mean(self) -> float:
        """The mean log-probability per target token (minus the cross-entropy)."""
        return self.total / self.tokens


class Scorer:
    """Scores pairs with a translator's parts (parts.py: its model on its device, its codec
    and batch budget), translating into `tgt_lang` (None: the model's one language)."""

    def __init__(self, parts: Parts, tgt_lang: str | None = None) -> None:
        parts.codec.languages.check(tgt_lang)
        self.parts, self.tgt_lang = parts, tgt_lang
        self.limit = parts.model.max_positions

    def target_ids(self, line: str, number: int) -> list[int]:
        """A target line's ids with EOS; refused if longer than the model's positions."""
        ids = self.parts.codec.target(line)
        if len(ids) > self.limit:
            raise MtxError(
                f"line {number + 1}: the target has {len(ids)} tokens with EOS, more than the "
                f"{self.limit} positions the model takes"
            )
        return ids

    def score(self, sources: list[str], targets: list[str], first: int = 0) -> list[Score]:
        """The score of each (source, target) pair, in input order (`first`: the first pair's
        number from 0, for errors)."""
        if len(sources) != len(targets):
            raise MtxError(f"{len(sources)} sources but {len(targets)} targets")
        src = [self.parts.codec.encode(line, self.tgt_lang) for line in sources]
        tgt = [self.target_ids(line, first + i) for i, line in enumerate(targets)]
        return self.score_ids(src, tgt)

    def cross_entropies(self, sources: list[str], targets: list[str]) -> list[float]:
        """Each pair's cross-entropy: -log p(target | source) per target token (its mean
        negative log-probability). The one policy for a target longer than the model takes:
        +inf (the pair is then the worst scored, never an error); its source is cut, as
        translation cuts it. Scored CHUNK pairs at a time (their per-token scores let go)."""
        if len(sources) != len(targets):
            raise MtxError(f"{len(sources)} sources but {len(targets)} targets")
        out = [math.inf] * len(sources)
        for start in range(0, len(sources), CHUNK):
            src, tgt, rows = [], [], []
            for i in range(start, min(start + CHUNK, len(sources))):
                ids = self.parts.codec.target(targets[i])
                if len(ids) <= self.limit:
                    src.append(self.parts.codec.encode(sources[i], self.tgt_lang))
                    tgt.append(ids)
                    rows.append(i)
            for i, score in zip(rows, self.score_ids(src, tgt)):
                out[i] = -score.mean
        return out

    def score_ids(self, src: list[list[int]], tgt: list[list[int]]) -> list[Score]:
        """The score of each pair of ids (sources as the translator encodes them, targets
        ending with EOS), in input order."""
        out: list[Score | None] = [None] * len(src)
        for rows in self.batches(src, tgt):
            for i, score in zip(rows, self.forced(src, tgt, rows)):
                out[i] = score
        return out  # type: ignore[return-value]

    def batches(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[int]]:
        """Row indices in batches of one padded (source, target) shape, shortest first, each
        at most `decode.batch_tokens` padded tokens of both sides (at least one pair)."""
        shapes: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, (s, t) in enumerate(zip(src, tgt)):
            shapes[(padded_length(len(s), self.limit), padded_length(len(t), self.limit))].append(i)
        budget = self.parts.batch_tokens
        out = []
        for (S, T), rows in sorted(shapes.items()):
            per = max(1, budget // (S + T))
            out += [rows[k : k + per] for k in range(0, len(rows), per)]
        return out

    def inputs(self, src: list[list[int]], tgt: list[list[int]], rows: list[int]):
        """The forced pass's padded sources (B, S) and decoder inputs (B, n + T) of the pairs
        `rows` (of one padded shape), on the device, and n: the ids the decoder reads after its
        start token before the target (an NLLB model's language code), not scored."""
        S = padded_length(len(src[rows[0]]), self.limit)
        T = padded_length(len(tgt[rows[0]]), self.limit)
        source = pad([src[i] for i in rows], length=S).to(self.parts.device)
        given = list(self.parts.codec.start(self.tgt_lang))
        start = self.parts.model.specials.start
        tgt_in = pad([given + tgt[i][:-1] for i in rows], prefix=start, length=T + len(given))
        return source, tgt_in.to(self.parts.device), len(given)

    @torch.no_grad()
    def forced(self, src: list[list[int]], tgt: list[list[int]], rows: list[int]) -> list[Score]:
        """One forward pass over the pairs `rows` (of one padded shape): their scores."""
        model, device = self.parts.model, self.parts.device
        source, tgt_in, n = self.inputs(src, tgt, rows)
        T = padded_length(len(tgt[rows[0]]), self.limit)
        tgt_out = pad([tgt[i] for i in rows], length=T).to(device)
        memory, mask = model.encode(source)
        out = model.decode(tgt_in, memory, mask)[:, n:]  # (B, T, V) logits or lprobs
        lprobs = out.float()
        if not model.capabilities.log_probs:
            lprobs = torch.log_softmax(lprobs, dim=-1)
        picked = lprobs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1).double().cpu()
        scores = []
        for r, i in enumerate(rows):
            per_token = picked[r, : len(tgt[i])].tolist()
            total = 0.0
            for x in per_token:  # in order, in float64: the same sum in any batch
                total += x
            scores.append(Score(total, len(per_token), per_token))
        return scores
