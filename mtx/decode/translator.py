"""Translate strings with a trained checkpoint: SentencePiece in, search, SentencePiece out.

Input lines are sorted by length into token-budget batches and the output is put back in
input order, one output line per input line (an empty input line gets a translation too).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from mtx.config import Config
from mtx.data import vocab
from mtx.data.batching import pad, token_batches
from mtx.decode.search import Hypothesis, beam_search, greedy_search
from mtx.errors import MtxError
from mtx.model.transformer import EOS_ID, Transformer
from mtx.train import checkpoint
from mtx.train.trainer import pick_device


class Translator:
    def __init__(
        self, model: Transformer, cfg: Config, spm_proto: bytes, device: str = "auto"
    ) -> None:
        self.device = pick_device(device)
        self.model = model.to(self.device).eval()
        self.cfg = cfg
        self.sp = vocab.load(spm_proto)
        if self.sp.get_piece_size() != model.vocab_size:
            raise MtxError(
                f"the SentencePiece model has {self.sp.get_piece_size()} pieces but the model's "
                f"vocabulary has {model.vocab_size}: they do not belong together"
            )

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, overrides: list[str] | None = None, device: str = "auto"
    ) -> Translator:
        model, cfg, spm_proto = checkpoint.load_model(path, overrides)
        return cls(model, cfg, spm_proto, device)

    def encode(self, line: str) -> list[int]:
        ids = self.sp.encode(" ".join(line.split()))[: self.model.cfg.max_positions - 1]
        return ids + [EOS_ID]

    def search(self, src: torch.Tensor, nbest: int = 1) -> list[list[Hypothesis]]:
        d = self.cfg.decode
        limit = self.model.cfg.max_positions - 1
        if d.beam == 1:
            return [[h] for h in greedy_search(self.model, src, d.max_len_a, d.max_len_b, limit)]
        return beam_search(self.model, src, d.beam, d.alpha, d.max_len_a, d.max_len_b, limit, nbest)

    def translate_ids(self, lines: list[str], nbest: int = 1) -> list[list[Hypothesis]]:
        ids = [self.encode(line) for line in lines]
        lens = [len(x) for x in ids]
        out: list[list[Hypothesis]] = [[] for _ in lines]
        for batch in token_batches(lens, lens, self.cfg.decode.batch_tokens):
            src = pad([ids[i] for i in batch]).to(self.device)
            for i, hyps in zip(batch.tolist(), self.search(src, nbest)):
                out[i] = hyps
        return out

    def translate(self, lines: list[str]) -> list[str]:
        """One detokenized translation per input string, in input order."""
        return [self.detokenize(hyps[0].tokens) for hyps in self.translate_ids(lines)]

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(self.sp.decode(ids).split())  # never a newline inside a line

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 512) -> Iterator[str]:
        """Translate an endless iterable chunk by chunk, yielding outputs in order."""
        chunk: list[str] = []
        for line in lines:
            chunk.append(line)
            if len(chunk) >= chunk_lines:
                yield from self.translate(chunk)
                chunk = []
        if chunk:
            yield from self.translate(chunk)
