"""Speculative greedy search: a small draft model proposes, the model verifies (Leviathan et
al. 2023; Xia et al. 2023; shared/REFERENCE.md, "Speculative decoding").

Shape legend: N sentences still decoded, Q query rows of one verifying call, V vocabulary.

Greedy search (search.py) calls the model once per output token. Here, for each sentence, the
draft (`decode.draft`: a student distilled from the model, on the same vocabulary) proposes up
to k tokens, one cheap call each, and the model reads the sentence's last token and the k
drafts in one call, which gives its own most probable token after each of them. The drafts it
agrees with, in order, are kept, and its own token after the last of them is added: every
round yields between 1 and k + 1 tokens, each the one greedy search would have chosen. The
rows of a batch accept drafts of different lengths and stand at positions of their own
(model/ragged.py's cache); a rejected draft costs nothing to take back.

Exact, not approximately so: the verifying call computes each position with the shapes a step
of greedy search gives it (model/ragged.py), so its log-probabilities are greedy search's bit
for bit, on the CPU, in any batch; the rules (rules.py: the longest output, the tokens never
produced) are applied as greedy search applies them. The output, tokens and scores, is greedy
search's whatever the draft proposes: a poor draft costs speed, never a token
(tests/test_speculative.py). `DraftStats` counts what the drafts were worth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mtx.data import vocab
from mtx.decode import rules
from mtx.decode.languages import Languages
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis, SearchSettings
from mtx.decode.search import next_log_probs
from mtx.decode.shortlist import vocabulary_sha256
from mtx.errors import MtxError
from mtx.model.build import load_model
from mtx.model.groups import Groups
from mtx.model.interface import Decodable
from mtx.tokens import EOS_ID


def load_draft(path: str, model: Decodable, spm_sha256: str, languages, pack: str) -> Decodable:
    """The draft model of checkpoint `path` for `model` (whose SentencePiece model has
    `spm_sha256`, whose language scheme is `languages`): on its device and dtype, packed as
    it is (`pack`: fp32 or int8), or MtxError naming what they do not share."""
    draft, cfg, proto = load_model(path)
    where = f"decode.draft {path}"
    if vocabulary_sha256(proto) != spm_sha256 or draft.vocab_size != model.vocab_size:
        raise MtxError(
            f"{where}: another vocabulary (SentencePiece model) than the model's; a draft "
            "shares it (mtx prepare --set data.spm_model=MODEL.pt)"
        )
    mine = Languages.of(vocab.load(proto), cfg.data)
    if languages is not None and mine != languages:
        raise MtxError(
            f"{where}: translates {mine.src_lang}->{mine.tgt_lang} ({mine.scheme}), the model "
            f"{languages.src_lang}->{languages.tgt_lang} ({languages.scheme})"
        )
    if draft.specials != model.specials:
        raise MtxError(f"{where}: its decoder starts from another token than the model's")
    if not draft.capabilities.ragged:
        raise MtxError(f"{where}: the draft must be a Transformer, not {type(draft).__name__}")
    if draft.max_positions < model.max_positions:
        raise MtxError(
            f"{where}: takes {draft.max_positions} positions, fewer than the model's "
            f"{model.max_positions}"
        )
    weight = next(model.parameters())
    draft = draft.to(weight.device, weight.dtype).eval()
    draft.pack(pack)
    return draft


@dataclass
class DraftStats:
    """What the drafts were worth: per (sentence, verifying call) `checks`, the tokens drafted
    and those the model accepted; `batches`, the batches decoded with each draft length (0: by
    greedy search alone, as `decode.draft_adaptive` may choose: tuning.py)."""

    checks: int = 0
    drafted: int = 0
    accepted: int = 0
    batches: dict[int, int] = field(default_factory=dict)  # draft length (0: none) -> batches

    def reset(self) -> None:
        self.checks = self.drafted = self.accepted = 0
        self.batches = {}

    def batch(self, k: int) -> None:
        """Count a batch decoded with `k` drafts a call (0: greedy search alone)."""
        self.batches[k] = self.batches.get(k, 0) + 1

    def merge(self, other: DraftStats) -> None:
        """Add another process's counts (a torchrun job's: jobs/shards.py)."""
        self.checks += other.checks
        self.drafted += other.drafted
        self.accepted += other.accepted
        for k, n in other.batches.items():
            self.batches[k] = self.batches.get(k, 0) + n

    @property
    def acceptance(self) -> float:
        """The share of drafted tokens the model accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Drafted tokens accepted per verifying call of a sentence (each call adds its own)."""
        return self.accepted / self.checks if self.checks else 0.0

    def summary(self) -> str:
        """One line of what the drafts were worth ("" before any batch)."""
        if not self.batches:
            return ""
        ks = sorted(self.batches)
        counts = " / ".join(f"{self.batches[k]:,}" for k in ks)
        line = f"drafts: batches decoded with {' / '.join(map(str, ks))} drafts a call: {counts}"
        if self.drafted:
            line += (
                f"; {100 * self.acceptance:.1f}% of {self.drafted:,} drafted tokens accepted, "
                f"{self.mean_accepted:.2f} a call"
            )
        return line

    @classmethod
    def from_json(cls, values: dict) -> DraftStats:
        """The counts `to_json` wrote (a benchmark's worker process: bench/decode.py)."""
        batches = {int(k): n for k, n in values["batches"].items()}
        return cls(values["checks"], values["drafted"], values["accepted"], batches)

    def to_json(self) -> dict:
        return {
            "checks": self.checks,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4),
            "mean_accepted": round(self.mean_accepted, 3),
            "batches": {str(k): n for k, n in sorted(self.batches.items())},
        }


@dataclass
class _Row:
    """One sentence being decoded: what its decoder has read and produced."""

    history: list[int]  # the decoder's inputs: the start tokens, then the output so far
    max_len: int  # its longest output, EOS included
    drafted_to: int  # positions the draft has read (those agreeing with `history`)
    hyp: Hypothesis = field(default_factory=lambda: Hypothesis([], 0.0, 0.0))
    done: bool = False

    @property
    def read(self) -> int:
        """Positions the model has read: every input but the last token, not yet read."""
        return len(self.history) - 1

    def room(self, k: int) -> int:
        """How many drafts a verifying call may check: k, fewer where its longest output
        leaves fewer (the last token may only be EOS)."""
        return max(0, min(k, self.max_len - len(self.hyp.tokens) - 1))

    def extend(self, drafts: list[int], tokens: list[int], lps: list[float]) -> int:
        """The model's `tokens` and log-probabilities after the last token and after each of
        `drafts`: the agreed ones, then the model's own, added as greedy search adds them
        (EOS ends it). Returns the drafts accepted."""
        for j, (tok, lp) in enumerate(zip(tokens, lps)):
            self.hyp.log_prob += lp
            agreed = j < len(drafts) and drafts[j] == tok
            if tok == EOS_ID:
                self.hyp.score, self.done = self.hyp.log_prob, True
                return j + agreed
            self.hyp.tokens.append(tok)
            self.history.append(tok)
            if not agreed:
                break
        self.drafted_to = min(self.drafted_to, self.read)
        return j


@torch.inference_mode()
def speculative_search(
    model: Decodable,
    draft: Decodable,
    batch: SearchBatch | Tensor | Groups,
    settings: SearchSettings = SearchSettings(),
    k: int = 4,
    stats: DraftStats | None = None,
) -> list[Hypothesis]:
    """Greedy search's hypothesis of each sentence of `batch` (search.py's `greedy_search`,
    tokens and scores), `draft` proposing up to `k` tokens a round (see above); `stats`
    counts the drafts."""
    batch = SearchBatch.of(batch)
    stats = DraftStats() if stats is None else stats
    device, s = batch.src.device, settings
    memory, src_mask = model.encode(batch.src)
    d_memory, d_mask = draft.encode(batch.src)
    starts = batch.starts(model.specials.start)  # (N, 1 + n)
    rows = [
        _Row(list(start), r.longest(s.max_len_a, s.max_len_b, s.limit), starts.size(1))
        for start, r in zip(starts.tolist(), batch.requests)
    ]
    out = [row.hyp for row in rows]
    capacity = starts.size(1) + max(row.max_len for row in rows)
    cache, d_cache = model.new_ragged_cache(capacity), draft.new_ragged_cache(capacity)
    force = [rules.at_limit(1, row.max_len) for row in rows]  # greedy search's first step
    lprobs = next_log_probs(model, starts, memory, src_mask, cache, force)
    best = lprobs.argmax(dim=-1)
    for row, tok, lp in zip(rows, best.tolist(), lprobs.gather(1, best[:, None]).tolist()):
        row.extend([], [tok], lp)
    draft.decode(starts, d_memory, d_mask, d_cache)  # the draft reads the start tokens
    while True:
        keep = [i for i, row in enumerate(rows) if not row.done]
        if not keep:
            return out
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            rows = [rows[i] for i in keep]
            cache.select(index)
            d_cache.select(index)
            src_mask, d_mask = _rows(src_mask, index), _rows(d_mask, index)
        drafts = _draft(draft, d_cache, rows, k, d_mask, device)
        tokens, lps = _verify(model, cache, rows, drafts, src_mask, device)
        for row, d, tok, lp in zip(rows, drafts, tokens, lps):
            stats.checks, stats.drafted = stats.checks + 1, stats.drafted + len(d)
            stats.accepted += row.extend(d, tok, lp)


def _rows(mask: Tensor | Groups | None, index: Tensor) -> Tensor | Groups | None:
    """Rows `index` of a source mask (None: no padding anywhere)."""
    return None if mask is None else mask.index_select(0, index)


def _draft(
    draft: Decodable, cache, rows: list[_Row], k: int, src_mask: Tensor | Groups | None, device
) -> list[list[int]]:
    """Each row's drafts: up to `k` (`room`) tokens the draft takes for the most probable
    after the row's last token, each read in turn. The draft first reads what it has not read
    of the row's inputs (after a call that accepted all it drafted, its last draft)."""
    feeds = [row.history[row.drafted_to :] if row.room(k) else [] for row in rows]
    drafts: list[list[int]] = [[] for _ in rows]
    never = draft.specials.never_below
    while True:
        active = [i for i, feed in enumerate(feeds) if feed]
        if not active:
            return drafts
        tokens = torch.tensor([[feeds[i].pop(0)] for i in active], device=device)
        cache.feed(active, [rows[i].drafted_to for i in active], len(rows), device)
        mask = src_mask if len(active) == len(rows) else _rows(src_mask, cache.rows)
        logits = draft.decode(tokens, None, mask, cache)[:, -1]
        logits[:, :never] = -torch.inf
        for i, tok in zip(active, logits.argmax(dim=-1).tolist()):
            rows[i].drafted_to += 1
            if not feeds[i]:  # it read the row's last token or last draft: `tok` drafts
                drafts[i].append(tok)
                if len(drafts[i]) < rows[i].room(k) and tok != EOS_ID:
                    feeds[i].append(tok)


def _verify(
    model: Decodable, cache, rows: list[_Row], drafts: list[list[int]], src_mask, device
) -> tuple[list[list[int]], list[list[float]]]:
    """The model's most probable token, and its log-probability, after each row's last token
    and after each of its drafts: one call, a query row per position (model/ragged.py), each
    computed as greedy search computes it."""
    tokens, queries, positions, force = [], [], [], []
    for i, (row, d) in enumerate(zip(rows, drafts)):
        for j, tok in enumerate([row.history[-1], *d]):
            tokens.append(tok)
            queries.append(i)
            positions.append(row.read + j)
            force.append(rules.at_limit(len(row.hyp.tokens) + j + 1, row.max_len))
    cache.feed(queries, positions, len(rows), device)
    mask = src_mask if cache.rows is None else _rows(src_mask, cache.rows)
    ids = torch.tensor(tokens, device=device).unsqueeze(1)
    lprobs = next_log_probs(model, ids, None, mask, cache, force)
    best = lprobs.argmax(dim=-1)
    found, lps = best.tolist(), lprobs.gather(1, best[:, None]).squeeze(1).tolist()
    out_tokens, out_lps, at = [], [], 0
    for d in drafts:
        out_tokens.append(found[at : at + len(d) + 1])
        out_lps.append(lps[at : at + len(d) + 1])
        at += len(d) + 1
    return out_tokens, out_lps
