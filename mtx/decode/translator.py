"""Translate strings with a trained checkpoint: SentencePiece in, search, SentencePiece out.

    translator = Translator.from_checkpoint("runs/multi30k/checkpoints/best.pt")
    translator.translate(["A man rides a bike.", "Two dogs play."])

Input lines are sorted by length into token-budget batches (`decode.batch_tokens` source
tokens, padding included) and the output is put back in input order, one output per input
line (an empty input line gets a translation too). A line's translation does not depend on
the other lines, on the batch size or on the order: the search treats each sentence on its
own (decode/search.py), sources are padded to a length of their own (`source_batches`; a
batch of several such lengths reads each group's source with that group's own shapes,
model/groups.py) and small matrix products are padded to a fixed number of rows
(model/rows.py), so a sentence is computed with the same numbers in any batch. With
`decode.sampling`, the line numbered i draws its random numbers from the seed (decode.seed, i).

`translate_stream` translates an endless iterable in chunks with bounded memory, yielding
each chunk's translations as soon as they are ready.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from mtx import corpora
from mtx.config import Config
from mtx.data import vocab
from mtx.data.batching import pad
from mtx.decode.ensemble import Ensemble
from mtx.decode.search import Hypothesis, Sampling, beam_search, greedy_search
from mtx.decode.static import StaticSearch
from mtx.decode.static import supports as supports_static
from mtx.device import pick_device
from mtx.errors import MtxError
from mtx.model import packed
from mtx.model.build import Model, load_model
from mtx.model.groups import Groups
from mtx.tokens import BOS_ID, encode_line, padded_length

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
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return DTYPES[name]


class Translator:
    def __init__(
        self,
        model: Model | Ensemble,
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
        self.static_searches: dict[tuple, StaticSearch] = {}  # see static_search
        self.sp = vocab.load(spm_proto)
        if self.sp.get_piece_size() != model.vocab_size:
            raise MtxError(
                f"the SentencePiece model has {self.sp.get_piece_size()} pieces but the model's "
                f"vocabulary has {model.vocab_size}: they do not belong together"
            )
        self.tags = corpora.tag_ids(self.sp)  # {language: its >>xx<< tag's id}; {}: one
        self.tgt_lang: str | None = None  # into; None: the model's one target language

    @property
    def languages(self) -> list[str]:
        """The languages the model translates into (from its tags, or its config's one)."""
        if self.tags:
            return sorted(self.tags)
        return corpora.target_languages(self.cfg.data)

    def into(self, lang: str | None) -> Translator:
        """This translator, translating into `lang` (None: as it is). A multilingual model's
        source then starts with the language's tag (mtx/corpora.py); a model with one target
        language takes only that one."""
        if lang is None:
            return self
        if lang not in self.languages:
            raise MtxError(
                f"target language {lang!r} is not one this model translates into "
                f"({', '.join(self.languages)})"
            )
        other = copy.copy(self)
        other.tgt_lang = lang
        return other

    def check_language(self) -> None:
        """Refuse to translate with a multilingual model before a target language is chosen."""
        if self.tags and self.tgt_lang is None:
            raise MtxError(
                f"this model translates into {', '.join(self.languages)}: name the target "
                "language (--tgt-lang, or tgt_lang in a request)"
            )

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, overrides: list[str] | None = None, device: str = "auto"
    ) -> Translator:
        model, cfg, spm_proto = load_model(path, overrides)
        return cls(model, cfg, spm_proto, device)

    @classmethod
    def from_checkpoints(
        cls, paths: list[Path], overrides: list[str] | None = None, device: str = "auto"
    ) -> Translator:
        """One checkpoint's translator, or the ensemble of several (ensemble.py): decode.*
        settings come from the first, and every checkpoint must hold the same vocabulary."""
        if len(paths) == 1:
            return cls.from_checkpoint(paths[0], overrides, device)
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
        return cls(Ensemble(models), cfg, spm_proto, device)

    def with_decode(self, **changes) -> Translator:
        """This translator (the same model and vocabulary, not copies) with other decode.*
        settings, e.g. `with_decode(beam=1)`."""
        other = copy.copy(self)
        decode = dataclasses.replace(self.cfg.decode, **changes)
        other.cfg = dataclasses.replace(self.cfg, decode=decode)
        return other

    def encode(self, line: str) -> list[int]:
        self.check_language()
        prefix = [self.tags[self.tgt_lang]] if self.tags else None
        return encode_line(self.sp, line, self.model.cfg.max_positions, prefix)

    def check_nbest(self, nbest: int) -> None:
        d = self.cfg.decode
        if nbest < 1:
            raise MtxError(f"--nbest must be at least 1, got {nbest}")
        if not d.sampling and nbest > d.beam:
            raise MtxError(f"--nbest {nbest} needs a beam of at least {nbest} (or sampling)")

    def search(
        self, src: torch.Tensor | Groups, nbest: int = 1, lines: list[int] | None = None
    ) -> list[list[Hypothesis]]:
        """The `nbest` hypotheses of each sentence of `src` (B, S), or of several padded
        lengths (`Groups`, for a model that `mixes_lengths`), best first; with sampling,
        `nbest` samples of each, `lines` giving each sentence's line number (its seed)."""
        self.check_nbest(nbest)
        d = self.cfg.decode
        limit = self.model.cfg.max_positions - 1
        if d.sampling:
            lines = list(range(src.size(0))) if lines is None else lines
            seeds = [[d.seed, i, j] for i in lines for j in range(nbest)]
            sampling = Sampling(d.temperature, d.top_k, d.top_p)
            hyps = greedy_search(
                self.model, src.repeat_interleave(nbest, 0), d.max_len_a, d.max_len_b, limit,
                sampling, seeds,
            )  # fmt: skip
            groups = [hyps[i : i + nbest] for i in range(0, len(hyps), nbest)]
            return [sorted(g, key=lambda h: -h.score) for g in groups]
        static = self.static_search()
        if static is not None:
            return static(src, nbest)
        if d.beam == 1:
            return [[h] for h in greedy_search(self.model, src, d.max_len_a, d.max_len_b, limit)]
        return beam_search(
            self.model, src, d.beam, d.alpha, d.max_len_a, d.max_len_b, limit, nbest, d.stopping
        )

    def static_search(self) -> StaticSearch | None:
        """The static search `decode.search` asks for (decode/static.py), or None for the
        shrinking one; one per decode settings, kept with its CUDA graphs."""
        d = self.cfg.decode
        mode = d.search
        if mode == "auto":
            mode = "graphs" if self.device.type == "cuda" else "shrinking"
        if mode == "shrinking":
            return None
        why = static_refusal(self.model, d, mode, self.device)
        if why:
            if d.search == "auto":
                return None
            raise MtxError(f"decode.search {mode}: {why}")
        limit = self.model.cfg.max_positions - 1
        key = (mode, d.beam, d.alpha, d.max_len_a, d.max_len_b, limit)
        if key not in self.static_searches:
            self.static_searches[key] = StaticSearch(
                self.model, d.beam, d.alpha, d.max_len_a, d.max_len_b, limit, mode == "graphs"
            )
        return self.static_searches[key]

    def translate_ids(
        self, lines: list[str], nbest: int = 1, first_line: int = 0
    ) -> list[list[Hypothesis]]:
        """The hypotheses of each line, in input order; `first_line` numbers the first line
        (for sampling seeds when `lines` is one chunk of a longer input)."""
        self.check_nbest(nbest)
        self.check_language()
        ids = [self.encode(line) for line in lines]
        out: list[list[Hypothesis]] = [[] for _ in lines]
        lengths, limit = [len(x) for x in ids], self.model.cfg.max_positions
        mix = getattr(self.model, "mixes_lengths", False) and self.static_search() is None
        for batch in source_batches(lengths, self.cfg.decode.batch_tokens, limit, mix):
            parts = [pad([ids[i] for i in idx], length=n).to(self.device) for n, idx in batch]
            src = parts[0] if len(parts) == 1 else Groups(parts)
            rows = [i for _, idx in batch for i in idx]  # the lines of src's rows, in order
            numbers = [first_line + i for i in rows]
            for i, hyps in zip(rows, self.search(src, nbest, numbers)):
                out[i] = hyps
        return out

    def translate(self, lines: list[str]) -> list[str]:
        """One detokenized translation per input string, in input order."""
        return [self.detokenize(hyps[0].tokens) for hyps in self.translate_ids(lines)]

    def cross_attention(self, line: str, tokens: list[int]) -> dict:
        """The encoder-decoder attention while the decoder reads output `tokens` for source
        `line` (teacher-forced: the weights the search saw for that output, up to rounding).
        Returns the source and output subwords (each ending with EOS) and "weights", a float32
        tensor (decoder layers, heads, outputs, sources): row t is the attention when
        predicting output subword t."""
        src_ids = self.encode(line)
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[BOS_ID, *tokens]], device=self.device)
        layers = self.model.cross_attention_modules()
        for attn in layers:
            attn.keep_weights = True
        try:
            with torch.no_grad():
                memory, src_mask = self.model.encode(src)
                self.model.decode(tgt_in, memory, src_mask)
            weights = torch.stack([attn.weights[0] for attn in layers]).float().cpu()
        finally:
            for attn in layers:
                attn.keep_weights, attn.weights = False, None
        piece = self.sp.id_to_piece
        return {
            "source": [piece(i) for i in src_ids[:-1]] + ["</s>"],
            "output": [piece(i) for i in tokens] + ["</s>"],
            "weights": weights,
        }

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(self.sp.decode(ids).split())  # never a newline inside a line

    def hypotheses_stream(
        self,
        lines: Iterable[str],
        chunk_lines: int = 512,
        idle: float | None = None,
        nbest: int = 1,
    ) -> Iterator[list[Hypothesis]]:
        """`translate_ids` over an endless iterable, chunk by chunk (see `chunks`)."""
        self.check_nbest(nbest)
        self.check_language()
        first = 0
        for chunk in chunks(lines, chunk_lines, idle):
            yield from self.translate_ids(chunk, nbest, first)
            first += len(chunk)

    def translate_stream(
        self, lines: Iterable[str], chunk_lines: int = 512, idle: float | None = None
    ) -> Iterator[str]:
        """Translate an endless iterable chunk by chunk, yielding outputs in order."""
        for hyps in self.hypotheses_stream(lines, chunk_lines, idle):
            yield self.detokenize(hyps[0].tokens)


def static_refusal(model, d, mode: str, device: torch.device) -> str | None:
    """Why the static search cannot run with these decode settings (None: it can)."""
    if mode == "graphs" and device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type}"
    if not supports_static(model):
        return f"{type(model).__name__} has no static cache (the Transformer alone has one)"
    if d.sampling:
        return "sampling runs in the shrinking search only"
    if d.beam > 1 and d.stopping != "k_finished":
        return f"stopping {d.stopping} runs in the shrinking search only (static: k_finished)"
    return None


Batch = list[tuple[int, list[int]]]  # groups of (padded source length, line indices)


def source_batches(
    lengths: list[int], max_tokens: int, limit: int = 1 << 30, mix: bool = True
) -> list[Batch]:
    """Translation batches, shortest sources first: each a list of groups (padded length, line
    indices), ascending in length.

    Each source is padded to its own `padded_length`, so a sentence is computed with the same
    shapes, and so the same numbers, alone or in any batch. A batch holds at most `max_tokens`
    padded source tokens (at least one source); with `mix` it may hold several padded lengths
    (decoded together, each group's encoder and encoder-decoder attention on its own:
    model/groups.py), without it one.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[Batch] = []
    tokens = 0
    for i in order:
        padded = padded_length(lengths[i], limit)
        batch = batches[-1] if batches else None
        if batch is None or tokens + padded > max_tokens or (not mix and batch[-1][0] != padded):
            batches.append([(padded, [i])])
            tokens = padded
            continue
        if batch[-1][0] == padded:
            batch[-1][1].append(i)
        else:
            batch.append((padded, [i]))
        tokens += padded
    return batches


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def chunks(lines: Iterable[str], size: int, idle: float | None = None) -> Iterator[list[str]]:
    """Lists of `size` consecutive lines (the last one shorter).

    With `idle` (seconds), `lines` is read by a background thread and a shorter list goes out
    as soon as no line has come for `idle` seconds: a slow pipe or a person typing gets each
    answer without waiting for `size` lines. The reader runs at most `size` lines ahead, so
    memory stays bounded however long the input is.
    """
    if size < 1:
        raise MtxError(f"--chunk-lines must be at least 1, got {size}")
    chunk: list[str] = []
    if idle is None:
        for line in lines:
            chunk.append(line)
            if len(chunk) >= size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
        return
    pending: queue.Queue = queue.Queue(maxsize=size)
    end = object()

    def read() -> None:
        try:
            for line in lines:
                pending.put(line)
        except BaseException as e:  # handed to the consumer, which raises it
            pending.put(_Failed(e))
        pending.put(end)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            item = pending.get(timeout=idle) if chunk else pending.get()
        except queue.Empty:  # the input has paused: answer what has come
            yield chunk
            chunk = []
            continue
        if item is end:
            break
        if isinstance(item, _Failed):
            raise item.error
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
