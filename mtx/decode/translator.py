"""Translate strings with a trained checkpoint: SentencePiece in, search, SentencePiece out.

    translator = Translator.from_checkpoint("runs/multi30k/checkpoints/best.pt")
    translator.translate(["A man rides a bike.", "Two dogs play."])

Input lines are sorted by length into token-budget batches (`decode.batch_tokens` source
tokens, padding included) and the output is put back in input order, one output per input
line (an empty input line gets a translation too). A line's translation does not depend on
the other lines, on the batch size or on the order: the search treats each sentence on its
own (decode/search.py), sources are padded to a length of their own (batches.py; a batch of
several such lengths reads each group's source with that group's own shapes, model/groups.py)
and small matrix products are padded to a fixed number of rows (model/rows.py), so a sentence
is computed with the same numbers in any batch. With `decode.sampling`, the line numbered i
draws its random numbers from the seed (decode.seed, i).

The Translator holds the model on its device and dtype, the vocabulary and the target
language; which search runs is searches.py's, how lines make batches batches.py's, and how an
endless input is read in chunks stream.py's. `translate_stream` translates an endless iterable
in chunks with bounded memory, yielding each chunk's translations as soon as they are ready.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from mtx.config import Config
from mtx.data import vocab
from mtx.decode import dispatch
from mtx.decode.batches import request_batches
from mtx.decode.controls import Line, fits, segment
from mtx.decode.ensemble import Ensemble
from mtx.decode.languages import Languages
from mtx.decode.request import Request, SearchBatch
from mtx.decode.result import Output, Translation
from mtx.decode.rules import Hypothesis
from mtx.decode.searches import Searches
from mtx.decode.shortlist import vocabulary_sha256
from mtx.decode.static import StaticSearch
from mtx.decode.stream import chunks
from mtx.device import auto_dtype, pick_device
from mtx.errors import MtxError
from mtx.model import packed
from mtx.model.build import load_model
from mtx.model.capture import capture_cross_attention
from mtx.model.groups import Groups
from mtx.model.interface import Decodable
from mtx.tokens import encode_line

# int8: a float32 model whose linear layers run with int8 weights (model/packed.py), CPU only
DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "int8": torch.float32,
}


def decode_dtype(device: torch.device, name: str) -> torch.dtype:
    """The dtype `decode.dtype` names; auto is bf16 on a GPU that supports it, else fp32."""
    if name == "int8" and device.type != "cpu":
        raise MtxError(f"decode.dtype int8 runs on the CPU only, not on {device.type}")
    if name == "int8" and not packed.available("int8"):
        raise MtxError(
            "decode.dtype int8 needs torch's fbgemm int8 kernels, which this build lacks"
        )
    return auto_dtype(device) if name == "auto" else DTYPES[name]


@dataclasses.dataclass
class Attention:
    """The encoder-decoder attention of one translation: the source and output subwords (each
    ending with EOS) and `weights`, a float32 tensor (decoder layers, heads, outputs,
    sources) whose row t is the attention when predicting output subword t."""

    source: list[str]
    output: list[str]
    weights: torch.Tensor

    def mean(self) -> torch.Tensor:
        """(outputs, sources): averaged over decoder layers and heads."""
        return self.weights.mean(dim=(0, 1))

    def to_json(self) -> dict:
        """{"source", "output", "weights": the mean's rows}: what `mtx serve` answers."""
        return {"source": self.source, "output": self.output, "weights": self.mean().tolist()}


class Translator:
    def __init__(
        self,
        model: Decodable,
        cfg: Config,
        spm_proto: bytes,
        device: str = "auto",
        as_is: bool = False,
    ) -> None:
        """`as_is`: translate with the model where and as it is (its device and dtype, in
        whatever mode it is in; the trainer's validation sets eval mode and autocast)."""
        if as_is:
            weight = next(model.parameters())
            self.device, self.dtype, self.model = weight.device, weight.dtype, model
        else:
            self.device = pick_device(device, "--device")
            self.dtype = decode_dtype(self.device, cfg.decode.dtype)
            self.model = model.to(self.device, self.dtype).eval()
            self.model.pack("int8" if cfg.decode.dtype == "int8" else "fp32")  # CPU fp32 only
        self.cfg = cfg
        self.vocab = vocab.load(spm_proto)
        if self.vocab.get_piece_size() != model.vocab_size:
            raise MtxError(
                f"the vocabulary has {self.vocab.get_piece_size()} pieces but the model's "
                f"vocabulary has {model.vocab_size}: they do not belong together"
            )
        for m in model.members():
            vocab.check_decoder_start(self.vocab, m.cfg.decoder_start)
        # shared by with_decode's copies; a shortlist is loaded and checked now, not mid-input
        self.langs = Languages.of(self.vocab, cfg.data)  # the one language scheme
        sha = vocabulary_sha256(spm_proto)
        self.searches = Searches(self.model, self.device, sha, self.vocab, self.langs)
        self.searches.decoded(cfg.decode)
        self.searches.drafter(cfg.decode)
        self.check_alignments(cfg.decode)
        self.tgt_lang: str | None = None  # into; None: the model's one target language

    @property
    def languages(self) -> list[str]:
        """The languages the model translates into (languages.py)."""
        return list(self.langs.targets)

    def into(self, lang: str | None) -> Translator:
        """This translator, translating into `lang` (None: as it is). A multilingual model's
        source then starts with the language's tag (mtx/corpora.py); a model with one target
        language takes only that one."""
        if lang is None:
            return self
        if lang not in self.langs.targets:
            self.langs.check(lang)
        other = copy.copy(self)
        other.tgt_lang = lang
        return other

    def check_language(self) -> None:
        """Refuse to translate with a multilingual model before a target language is chosen."""
        self.langs.check(self.tgt_lang)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        overrides: list[str] | None = None,
        device: str = "auto",
        decode: dict | None = None,
    ) -> Translator:
        """The translator of a checkpoint, its config with `overrides` ("key=value" strings:
        --set) and then `decode`'s typed decode.* settings (a command's options) applied."""
        return cls.from_checkpoints([Path(path)], overrides, device, decode)

    @classmethod
    def from_checkpoints(
        cls,
        paths: list[Path],
        overrides: list[str] | None = None,
        device: str = "auto",
        decode: dict | None = None,
    ) -> Translator:
        """One checkpoint's translator, or the ensemble of several (ensemble.py): decode.*
        settings come from the first, and every checkpoint must hold the same vocabulary."""
        models, cfg, spm_proto = [], None, b""
        for path in paths:
            model, model_cfg, proto = load_model(path, overrides)
            if cfg is None:
                cfg, spm_proto = model_cfg, proto
            elif proto != spm_proto or model.vocab_size != models[0].vocab_size:
                raise MtxError(
                    f"{path}: another vocabulary (SentencePiece model) than {paths[0]}; the "
                    "checkpoints of an ensemble must share one"
                )
            models.append(model)
        cfg = cfg.with_decode(**(decode or {}))
        return cls(models[0] if len(models) == 1 else Ensemble(models), cfg, spm_proto, device)

    def with_decode(self, **changes) -> Translator:
        """This translator (the same model and vocabulary, not copies) with other decode.*
        settings, e.g. `with_decode(beam=1)`."""
        other = copy.copy(self)
        decode = dataclasses.replace(self.cfg.decode, **changes)
        other.cfg = dataclasses.replace(self.cfg, decode=decode)
        other.searches.drafter(decode)
        other.check_alignments(decode)
        return other

    def check_alignments(self, d) -> None:
        """decode.alignments reads one model's attention: refused, in one line, for an
        ensemble, before any line is read."""
        if d.alignments and not self.model.capabilities.attention:
            raise MtxError(
                "decode.alignments reads one model's attention: give one checkpoint, not an "
                "ensemble"
            )

    def encode(self, line: str) -> list[int]:
        """A source line's ids (its target language's tag first, for a multilingual model; an
        NLLB model's source-language code)."""
        prefix = self.langs.source_prefix(self.tgt_lang)
        return encode_line(self.vocab.source, line, self.model.max_positions, prefix)

    def start(self) -> tuple[int, ...]:
        """What the decoder reads after its start token (Request.start): an NLLB model's
        target-language code; nothing for the others."""
        return self.langs.start(self.tgt_lang)

    def request(
        self, item: str | Line | Sequence[int], number: int = 0, max_len: int | None = None
    ) -> Request:
        """The one place a `Request` is built (request.py): what translating `item` (a source
        line, a `Line` with controls, or a source already encoded by `encode`), numbered
        `number` in its input from 0 (its samples' seed), asks of a search; `max_len` its
        own longest output, EOS included. Its controls are checked against the search that
        takes them (dispatch.py) and segmented (controls.py); an error names the line."""
        self.check_language()
        controls = item.controls if isinstance(item, Line) else None
        if isinstance(item, Line | str):
            source = tuple(self.encode(item if isinstance(item, str) else item.text))
        else:
            source = tuple(item)
        request = Request(source, number, max_len, start=self.start())
        if not controls:
            return request
        try:
            dispatch.check(controls, self.cfg.decode, device=self.device.type)
            never, longest = self.model.specials.never_below, self.longest(request)
            segmented = segment(controls, self.vocab.target.encode, never, longest)
        except MtxError as e:
            raise MtxError(f"line {number + 1}: {e}") from None
        return dataclasses.replace(request, controls=segmented)

    def longest(self, request: Request) -> int:
        """A request's longest output, EOS included (decode.max_len_a/b, the model's limit)."""
        d = self.cfg.decode
        return request.longest(d.max_len_a, d.max_len_b, self.searches.limit)

    def fits(self, request: Request) -> bool:
        """Whether a request's prefix, constraints and EOS fit in its longest output (then
        every output contains every constraint: controlled.py)."""
        return fits(request.controls, self.longest(request))

    def check_nbest(self, nbest: int) -> None:
        d = self.cfg.decode
        if nbest < 1:
            raise MtxError(f"--nbest must be at least 1, got {nbest}")
        if not d.sampling and nbest > d.beam:
            raise MtxError(f"--nbest {nbest} needs a beam of at least {nbest} (or sampling)")

    def search(
        self,
        src: SearchBatch | torch.Tensor | Groups,
        nbest: int = 1,
        lines: list[int] | None = None,
    ) -> list[list[Hypothesis]]:
        """The `nbest` hypotheses of each sentence of a `SearchBatch`, or of padded sources
        `src` (B, S) or of several padded lengths (`Groups`, for a model with
        `capabilities.mixed_lengths`), best first; with sampling, `nbest` samples of each,
        seeded by each sentence's line number (`lines` for padded sources)."""
        self.check_nbest(nbest)
        batch, start = SearchBatch.of(src, lines), self.start()
        if start and not isinstance(src, SearchBatch):
            requests = [dataclasses.replace(r, start=start) for r in batch.requests]
            batch = SearchBatch(batch.src, requests)
        return self.searches(batch, self.cfg.decode, nbest)

    def static_search(self) -> StaticSearch | None:
        """The static search `decode.search` asks for, or None for the shrinking one."""
        return self.searches.static(self.cfg.decode)

    def translate_ids(
        self, items: Sequence[str | Line | Sequence[int]], nbest: int = 1, first_line: int = 0
    ) -> list[list[Hypothesis]]:
        """The hypotheses of each item (what `request` takes), in input order; `first_line`
        numbers the first (sampling's seeds, when `items` is one chunk of a longer input)."""
        self.check_nbest(nbest)
        requests = [self.request(x, first_line + i) for i, x in enumerate(items)]
        return self.translate_requests(requests, nbest)

    def translate_requests(self, requests: list[Request], nbest: int = 1) -> list[list[Hypothesis]]:
        """The hypotheses of each request (`request`), in order: sorted by source length into
        batches of `decode.batch_tokens` padded source tokens (batches.py), searched."""
        self.check_nbest(nbest)
        out: list[list[Hypothesis]] = [[] for _ in requests]
        d, limit = self.cfg.decode, self.model.max_positions
        mix = self.model.capabilities.mixed_lengths and self.static_search() is None
        for batch, rows in request_batches(requests, d.batch_tokens, self.device, limit, mix):
            for i, hyps in zip(rows, self.searches(batch, d, nbest)):
                out[i] = hyps
        return self.aligned(requests, out) if d.alignments else out

    def aligned(
        self, requests: list[Request], hyps: list[list[Hypothesis]]
    ) -> list[list[Hypothesis]]:
        """The hypotheses with their word alignments (align.py), every hypothesis of every
        request read in one forced pass."""
        from mtx.decode.align import Aligner

        src = [list(r.source) for r, found in zip(requests, hyps) for _ in found]
        outputs = [h.tokens for found in hyps for h in found]
        links = iter(Aligner(self).word_links(src, outputs))
        return [
            [dataclasses.replace(h, links=tuple(sorted(next(links)))) for h in found]
            for found in hyps
        ]

    def translate(self, lines: list[str]) -> list[str]:
        """One detokenized translation per input string, in input order."""
        return [self.detokenize(hyps[0].tokens) for hyps in self.translate_ids(lines)]

    def cross_attention(self, line: str, tokens: list[int]) -> Attention:
        """The encoder-decoder attention while the decoder reads output `tokens` for source
        `line` (teacher-forced: the weights the search saw for that output, up to rounding)."""
        src_ids = self.encode(line)
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.model.specials.start, *tokens]], device=self.device)
        with torch.no_grad(), capture_cross_attention(self.model) as seen:
            memory, src_mask = self.model.encode(src)
            self.model.decode(tgt_in, memory, src_mask)
        weights = torch.stack([seen[i][0] for i in sorted(seen)]).float().cpu()
        piece = self.vocab.id_to_piece
        return Attention(
            source=[piece(i) for i in src_ids[:-1]] + ["</s>"],
            output=[piece(i) for i in tokens] + ["</s>"],
            weights=weights,
        )

    def translation(self, hyps: list[Hypothesis], alternatives: bool = False) -> Translation:
        """The result of a sentence (result.py) from its hypotheses, best first
        (`alternatives`: they are the alternatives it asked for)."""
        outputs = tuple(
            Output(self.detokenize(h.tokens), float(h.score), float(h.log_prob), h.unmet, h.links)
            for h in hyps
        )
        return Translation(outputs, alternatives)

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(self.vocab.decode(ids).split())  # never a newline inside a line

    def hypotheses_stream(
        self,
        lines: Iterable[str | Line],
        chunk_lines: int = 512,
        idle: float | None = None,
        nbest: int = 1,
        first_line: int = 0,
    ) -> Iterator[list[Hypothesis]]:
        """`translate_ids` over an endless iterable, chunk by chunk (stream.py's `chunks`),
        its first line numbered `first_line` (sampling's seeds). The settings are checked when
        it is called, before any line is read."""
        self.check_nbest(nbest)
        self.check_language()

        def stream() -> Iterator[list[Hypothesis]]:
            first = first_line
            for chunk in chunks(lines, chunk_lines, idle):
                yield from self.translate_ids(chunk, nbest, first)
                first += len(chunk)

        return stream()

    def translate_stream(
        self, lines: Iterable[str], chunk_lines: int = 512, idle: float | None = None
    ) -> Iterator[str]:
        """Translate an endless iterable chunk by chunk, yielding outputs in order."""
        for hyps in self.hypotheses_stream(lines, chunk_lines, idle):
            yield self.detokenize(hyps[0].tokens)
