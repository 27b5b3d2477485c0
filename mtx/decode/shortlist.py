"""Lexical shortlists (Marian's, and Bergamot's students'): at each step a sentence's next
token is chosen among a few hundred target pieces likely for its source instead of the whole
vocabulary, so the output projection, much of a small decoder's step, covers only the batch's
candidates (on Multi30k about 2,000 of 8,000 pieces for 32 sentences) and the softmax and the
choice of continuations only each sentence's own.

Building (`mtx shortlist`, from a run's prepared training data): mtx/jobs/shortlist.py, the
`top` target pieces of each source piece and the `frequent` ones.

Decoding (`decode.shortlist`, the shrinking search): a sentence's candidates are EOS, the
frequent pieces and the top pieces of each of its source pieces. Its hypotheses' states are
multiplied by those candidates' rows of the output matrix and normalised over them
(log-softmax over the candidates); every other piece gets -inf. A sentence decodes the same
alone or in any batch, as without a shortlist (`Shortlisted` says how).
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mtx.decode import rules
from mtx.errors import MtxError
from mtx.files import atomic_write
from mtx.model.base import EncoderDecoder
from mtx.model.groups import Groups
from mtx.model.interface import Capabilities, Lacks
from mtx.model.packed import PackedLinear
from mtx.model.rows import linear
from mtx.tokens import EOS_ID, PAD_ID


def vocabulary_sha256(spm_proto: bytes) -> str:
    """What ties a shortlist to the SentencePiece model it was built with."""
    return hashlib.sha256(spm_proto).hexdigest()


@dataclass
class Shortlist:
    top: np.ndarray  # (V, k) int32: each source piece's k best target pieces, -1 padded
    frequent: np.ndarray  # (F,) int32: the target pieces in the most pairs
    vocabulary: str  # vocabulary_sha256 of the SentencePiece model

    def candidates(self, src: Tensor) -> Tensor:
        """The sorted target ids a sentence with source ids `src` (S,) may produce."""
        ids = src[src != PAD_ID].cpu().numpy()
        parts = [self.top[ids[ids < len(self.top)]].ravel(), self.frequent, [EOS_ID]]
        union = np.unique(np.concatenate(parts).astype(np.int64))
        return torch.from_numpy(union[union >= 0])

    def save(self, path: Path) -> None:
        """An .npz of the fields, by name."""
        arrays = {f.name: np.asarray(getattr(self, f.name)) for f in fields(self)}
        atomic_write(path, lambda f: np.savez(f, **arrays))

    @classmethod
    def load(cls, path: str | Path) -> Shortlist:
        """Read a shortlist file; refused in one line if it is missing or not one."""
        try:
            with np.load(path, allow_pickle=False) as f:
                top, frequent, vocabulary = (f[field.name] for field in fields(cls))
                return cls(top, frequent, str(vocabulary))
        except FileNotFoundError:
            raise MtxError(f"decode.shortlist: file not found: {path}") from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise MtxError(
                f"decode.shortlist: {path} is not a shortlist (mtx shortlist): {e}"
            ) from None

    def check(self, vocabulary: str, vocab_size: int, where: str) -> None:
        if self.vocabulary != vocabulary or len(self.top) != vocab_size:
            raise MtxError(
                f"decode.shortlist: {where} was built with another vocabulary (SentencePiece "
                "model) than the checkpoint's; build it from this model's prepared data"
            )


@dataclass
class Bucket:
    """The live sentences whose candidates fit in `length` slots: their indices among the
    live sentences (nb,), and for each its candidates' columns in the batch's union
    (nb, length; the empty column past the union after its last) and ids (nb, length; PAD
    after its last, which the search rules out anyway)."""

    length: int
    members: Tensor
    columns: Tensor
    ids: Tensor
    flat: tuple | None = None  # K, then `indices`, for K beams

    def indices(self, K: int, union: int, vocab: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """For its sentences' K beams each: their rows (nb * K,), their candidates' ids
        (nb * K, length), and where their slots are in the flat (N, union + 1) logits and in
        the flat (N, vocab) log-probabilities, each (nb * K * length,)."""
        if self.flat is None or self.flat[0] != K:
            beams = torch.arange(K, device=self.members.device)
            rows = (self.members.unsqueeze(1) * K + beams).view(-1, 1)  # (nb * K, 1)
            columns = self.columns.repeat_interleave(K, 0)
            ids = self.ids.repeat_interleave(K, 0)
            take, put = (rows * (union + 1) + columns).view(-1), (rows * vocab + ids).view(-1)
            self.flat = (K, rows.view(-1), ids, take, put)
        return self.flat[1:]


class ShortlistCache:
    """The model's own cache, the projection onto the batch's candidates (the union of its
    sentences'), and each live sentence's candidates, grouped into buckets of like length."""

    def __init__(
        self, inner, project, union: int, sentences: list[tuple[Tensor, Tensor]], allowed: Tensor
    ) -> None:
        self.inner, self.project, self.union = inner, project, union
        self.allowed = allowed  # (2, V) rules.candidate_rules: not forced, forced to end
        self.sentences = sentences  # per live sentence: (columns, ids), padded to a bucket
        self.buckets = _buckets(sentences)

    def reorder(self, rows: Tensor) -> None:
        self.inner.reorder(rows)

    def select(self, sentences: Tensor) -> None:
        self.inner.select(sentences)
        self.sentences = [self.sentences[i] for i in sentences.tolist()]
        self.buckets = _buckets(self.sentences)


def _buckets(sentences: list[tuple[Tensor, Tensor]]) -> list[Bucket]:
    by_length: dict[int, list[int]] = {}
    for i, (columns, _) in enumerate(sentences):
        by_length.setdefault(len(columns), []).append(i)
    return [
        Bucket(
            length,
            torch.tensor(members, device=sentences[0][0].device),
            torch.stack([sentences[i][0] for i in members]),
            torch.stack([sentences[i][1] for i in members]),
        )
        for length, members in sorted(by_length.items())
    ]


def bucket_length(candidates: int) -> int:
    """The slots a sentence with this many candidates is normalised over: the next power of
    two from 64, a function of the sentence alone (see Shortlisted.decode)."""
    return max(64, 1 << (candidates - 1).bit_length())


class Shortlisted(Lacks):
    """A model whose candidates are each sentence's shortlist (a `Decodable`,
    model/interface.py, with `capabilities.candidates`): `continuations` finds the best continuations of beam and greedy search among
    them; `decode` gives the (N, V) log-probabilities that sampling draws from (-inf off the
    candidates).

    Per batch, the output matrix's rows of the union of its sentences' candidates are taken
    once (packed for the CPU where the model's layers are, model/packed.py; int8 quantizes
    each row as in the whole matrix). Each step multiplies every hypothesis by them; on the
    CPU each element of the product gets the same value whatever the other rows and columns
    (int8's integer sums are exact; for fp32, tests/helpers/capability_check.py checks it
    under every CPU capability). Each sentence's candidates are then gathered into
    `bucket_length` slots (the empty ones -inf), normalised there and searched there
    (rules.top_candidates, bucket by bucket): a sentence's log-softmax and its choice of
    continuations run over the same values in the same places in any batch."""

    def __init__(self, model: EncoderDecoder, shortlist: Shortlist) -> None:
        if not model.capabilities.output_matrix:
            raise MtxError(f"a shortlist takes one model, not {type(model).__name__}")
        self.model, self.shortlist = model, shortlist
        self.vocab_size, self.specials = model.vocab_size, model.specials
        self.capabilities = Capabilities(
            log_probs=True, mixed_lengths=model.capabilities.mixed_lengths, candidates=True
        )
        self._sources: list[Tensor] = []

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    def members(self) -> list[EncoderDecoder]:
        return [self.model]

    def encode(self, src: Tensor | Groups):
        parts = src.parts if isinstance(src, Groups) else [src]
        self._sources = [row for part in parts for row in part]  # for new_cache
        return self.model.encode(src)

    def new_cache(self) -> ShortlistCache:
        weight = self.model.output_weight()
        candidates = [self.shortlist.candidates(row) for row in self._sources]
        union = torch.unique(torch.cat(candidates))  # sorted
        sentences = []
        for ids in candidates:
            slots = bucket_length(len(ids))
            columns = torch.full((slots,), len(union), dtype=torch.long)
            columns[: len(ids)] = torch.searchsorted(union, ids)
            padded = torch.full((slots,), PAD_ID, dtype=torch.long)
            padded[: len(ids)] = ids
            sentences.append((columns.to(weight.device), padded.to(weight.device)))
        packed = self.model.packed_output
        rows = weight.index_select(0, union.to(weight.device))
        bias = self.model.output_bias()
        bias = None if bias is None else bias.index_select(0, union.to(bias.device))
        project = _projection(rows, bias, None if packed is None else packed.kind)
        allowed = rules.candidate_rules(
            self.vocab_size, self.specials, weight.device
        )  # once a search
        return ShortlistCache(self.model.new_cache(), project, len(union), sentences, allowed)

    def decode(self, tgt_in: Tensor, memory, src_mask, cache: ShortlistCache) -> Tensor:
        """(N, 1) last tokens -> (N, 1, V) log-probabilities, each sentence's K = N / B rows
        over its own candidates (what sampling draws from)."""
        out = None
        for _, _, lprobs, put in self._slots(tgt_in, memory, src_mask, cache):
            if out is None:
                out = lprobs.new_full((tgt_in.size(0), self.vocab_size), -torch.inf)
            out.view(-1).index_copy_(0, put, lprobs.view(-1))  # PAD's slots: -inf alike
        return out.unsqueeze(1)

    def continuations(
        self, last: Tensor, memory, src_mask, cache: ShortlistCache, force_eos: list[bool],
        scores: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """What rules.top_candidates gives for the live beams `scores` (B, K) and their last
        tokens `last` (B * K, 1), found among each sentence's candidates: the best 2K
        continuations' scores, source beams and tokens, each (B, 2K), best first. The rows
        where `force_eos` is True may only end."""
        K = scores.size(1)
        force = torch.tensor(force_eos, device=scores.device).long()
        found = []
        for bucket, (rows, ids), lprobs, _ in self._slots(last, memory, src_mask, cache):
            lprobs = lprobs.masked_fill(~cache.allowed[force[rows].unsqueeze(1), ids], -torch.inf)
            best, from_beam, slot = rules.top_candidates(scores[bucket.members], lprobs, K)
            tok = ids.view(len(bucket.members), -1).gather(1, from_beam * bucket.length + slot)
            found.append((bucket.members, best, from_beam, tok))
        if len(found) == 1:  # one bucket: every sentence, in order
            return found[0][1:]
        top = scores.new_empty(scores.size(0), 2 * K)
        beam = torch.empty(top.shape, dtype=torch.long, device=top.device)
        tok = torch.empty_like(beam)
        for members, *values in found:
            top[members], beam[members], tok[members] = values
        return top, beam, tok

    def _slots(self, tgt_in: Tensor, memory, src_mask, cache: ShortlistCache):
        """Decode a step; then for each bucket of sentences: the bucket, its beams' rows and
        candidates' ids, their log-probabilities (nb * K, length) normalised over each
        sentence's candidates, and where those go in the flat (N, vocab) log-probabilities."""
        states = self.model.states(tgt_in, memory, src_mask, cache.inner)
        logits = cache.project(states[:, -1]).float()  # (N, union)
        N = logits.size(0)
        logits = torch.cat([logits, logits.new_full((N, 1), -torch.inf)], 1).view(-1)
        for bucket in cache.buckets:
            rows, ids, take, put = bucket.indices(
                N // len(cache.sentences), cache.union, self.vocab_size
            )
            slots = logits.index_select(0, take).view(-1, bucket.length)
            yield bucket, (rows, ids), torch.log_softmax(slots, dim=-1), put


def _projection(weight: Tensor, bias: Tensor | None, kind: str | None):
    """x -> x @ weight.T + bias: packed for the CPU as `kind` says, else with padded rows."""
    if kind is not None:
        return PackedLinear(weight, bias, kind)
    return lambda x: linear(x, weight, bias)
