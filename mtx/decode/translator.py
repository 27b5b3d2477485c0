"""Translate text with trained checkpoints: a Translator of a few doors.

    translator = Translator.from_checkpoints("runs/multi30k/checkpoints/best.pt")
    translator.translate(["A man rides a bike.", "Two dogs play."])       # [Translation, ...]
    options = translator.options(beam=1, nbest=1, alignments=True)      # checked, one line
    for translation in translator.stream(sys.stdin, options): ...      # an endless input

- `options(**given)`: a request's options (options.py), the translator's decode.* settings
  unless given, checked against the engine table (engines.py) before any input is read;
- `translate(items, options)`: one `Translation` (result.py) an item, in order; an item is a
  source line, a `Line` with controls (controls.py) or a source already encoded; a text with
  no words gets the empty translation, undecoded;
- `stream(items, options, ...)`: the same over an endless iterable, chunk by chunk, with
  bounded memory, each chunk's translations as soon as they are ready (stream.py);
- `requests(items, options)`: every request `translate` would decode, built and checked (a
  corpus job checks its whole input with it before writing anything);
- `parts`: the model on its device, its settings, its codec (text and ids, both ways:
  codec.py) and its setup as the engine table reads it (parts.py);
- `stats`: what the run's constraints, glossary terms and drafts were worth.

Every check runs inside, at the door: the options against the engines (engines.py), each
line's controls against the engine that decodes it, the target language, the format. A
line's translation does not depend on the other lines, on the batch size or on the order: the
search treats each sentence on its own (search.py), sources are padded to a length of their
own (batches.py; a batch of several such lengths reads each group's source with that group's
own shapes, model/groups.py) and small matrix products are padded to a fixed number of rows
(model/rows.py), so a sentence is computed with the same numbers in any batch. With
`sampling`, the line numbered i draws its random numbers from the seed (seed, i).

Which engine decodes is engines.py's, what it runs with runtime.py's, how lines make batches
batches.py's; documents (options.format) are read and put back by documents.py, their marks
through the word alignment (align.py); the attention is read from beside the model
(model/capture.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mtx.config import Config
from mtx.data import vocab
from mtx.decode import documents, engines
from mtx.decode.batches import request_batches
from mtx.decode.codec import Codec
from mtx.decode.controls import Controls, Line, fits, needed
from mtx.decode.ensemble import Ensemble
from mtx.decode.glossary import Report
from mtx.decode.languages import Languages
from mtx.decode.options import Options
from mtx.decode.parts import Parts, setup_of
from mtx.decode.request import Request
from mtx.decode.result import Attention, Output, Translation
from mtx.decode.rules import Hypothesis
from mtx.decode.runtime import Runtime
from mtx.decode.shortlist import vocabulary_sha256
from mtx.decode.speculative import DraftStats
from mtx.decode.stream import chunks
from mtx.device import auto_dtype, pick_device
from mtx.errors import MtxError
from mtx.model import packed
from mtx.model.build import load_model
from mtx.model.capture import capture_cross_attention
from mtx.model.interface import Decodable

Item = str | Line | Sequence[int]  # a source line, a line with controls, or encoded ids

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


@dataclass
class Stats:
    """What a translator's run was worth: its constraints and glossary terms (glossary.py's
    Report), and its drafts (speculative.py's DraftStats), summed over a torchrun job's
    processes by `merge`."""

    terms: Report
    drafts: DraftStats

    def merge(self, other: Stats) -> None:
        self.terms.merge(other.terms)
        self.drafts.merge(other.drafts)

    def summaries(self) -> list[str]:
        """One line of each that has something to say."""
        return [line for line in (self.terms.summary(), self.drafts.summary()) if line]


class Translator:
    def __init__(
        self,
        model: Decodable,
        cfg: Config,
        spm_proto: bytes,
        device: str = "auto",
        as_is: bool = False,
        checkpoints: Sequence[Path] = (),
        glossary=None,
    ) -> None:
        """`as_is`: translate with the model where and as it is (its device and dtype, in
        whatever mode it is in; the trainer's validation sets eval mode and autocast);
        `glossary` (glossary.py): the target term of each source term a line holds becomes
        its constraint."""
        if as_is:
            weight = next(model.parameters())
            where = weight.device
        else:
            where = pick_device(device, "--device")
            model = model.to(where, decode_dtype(where, cfg.decode.dtype)).eval()
            model.pack("int8" if cfg.decode.dtype == "int8" else "fp32")  # CPU fp32 only
        spm = vocab.load(spm_proto)
        if spm.get_piece_size() != model.vocab_size:
            raise MtxError(
                f"the vocabulary has {spm.get_piece_size()} pieces but the model's "
                f"vocabulary has {model.vocab_size}: they do not belong together"
            )
        for m in model.members():
            vocab.check_decoder_start(spm, m.cfg.decoder_start)
        languages = Languages.of(spm, cfg.data)  # the one language scheme
        codec = Codec(spm, languages, model.max_positions)
        setup = setup_of(model, cfg.decode, languages, where.type)
        self.parts = Parts(model, where, cfg, codec, setup, tuple(checkpoints))
        sha = vocabulary_sha256(spm_proto)
        # a shortlist and a draft are loaded and checked now, not mid-input
        self._run = Runtime(model, where, cfg.decode, codec, setup, sha, tuple(checkpoints))
        self._glossary = glossary
        self.stats = Stats(Report(), self._run.stats)
        self._aligners: dict[str | None, object] = {}  # align.py's Aligner, by target language

    @classmethod
    def from_checkpoints(
        cls,
        paths: str | Path | Sequence[str | Path],
        overrides: list[str] | None = None,
        device: str = "auto",
        decode: dict | None = None,
        glossary=None,
    ) -> Translator:
        """The translator of a checkpoint, or the ensemble of several (ensemble.py): its
        config with `overrides` ("key=value" strings: --set), then `decode`'s typed decode.*
        settings (a command's options); decode.* from the first, every checkpoint holding the
        same vocabulary."""
        paths = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
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
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(model, cfg, spm_proto, device, checkpoints=paths, glossary=glossary)

    def options(self, **given) -> Options:
        """A request's options: this translator's decode.* settings but for `given`, checked
        against the engine that decodes a line without controls (engines.py)."""
        options = Options.of(self.parts.config.decode, **given)
        engines.check(Controls(), options, self.parts.setup)
        if options.documents:
            documents.settings_of(self.parts.config, options.format)  # its patterns, checked
        return options

    def requests(
        self, items: Iterable[Item], options: Options | None = None, first: int = 0
    ) -> list[Request]:
        """Every request `translate` would decode for `items` (numbered from `first`), built
        and checked, in order (a document's: each of its sentences); none for a text with no
        words."""
        o = self._checked(options)
        if o.documents:
            sentences = self._read(items, o, first)
            plain = o.sentences()
            return [self._request(s.item, s.number, plain) for s in sentences.sentences]
        numbered = [(first + i, self._glossed(x, first + i)) for i, x in enumerate(items)]
        return [self._request(x, n, o) for n, x in numbered if _words(x)]

    def translate(
        self, items: Sequence[Item], options: Options | None = None, first: int = 0
    ) -> list[Translation]:
        """The translation of each item (numbered from `first`: sampling's seeds, and where an
        error names a line), in order."""
        o = self._checked(options)
        if o.documents:
            return self._documents(items, o, first)
        out: list[Translation] = [Translation.empty(o.nbest)] * len(items)
        todo = [(i, self._glossed(x, first + i)) for i, x in enumerate(items)]
        todo = [(i, x) for i, x in todo if _words(x)]
        requests = [self._request(x, first + i, o) for i, x in todo]
        for (i, item), request, hyps in zip(todo, requests, self._search(requests, o)):
            out[i] = self._translation(item, request, hyps, o)
        return out

    def stream(
        self,
        items: Iterable[Item],
        options: Options | None = None,
        chunk_lines: int = 512,
        idle: float | None = None,
        first: int = 0,
    ) -> Iterator[Translation]:
        """`translate` over an endless iterable, chunk by chunk (stream.py), its first line
        numbered `first`. The options are checked now, before any line is read."""
        o = self._checked(options)

        def run() -> Iterator[Translation]:
            number = first
            for chunk in chunks(items, chunk_lines, idle):
                yield from self.translate(chunk, o, number)
                number += len(chunk)

        return run()

    # ---- inside the doors ----------------------------------------------------------------

    def _checked(self, options: Options | None) -> Options:
        if options is None:
            return self.options()
        engines.check(Controls(), options, self.parts.setup)
        return options

    def _glossed(self, item: Item, number: int) -> Item:
        """The item with its glossary terms among its constraints (glossary.py)."""
        if self._glossary is None or not isinstance(item, str | Line):
            return item
        line = item if isinstance(item, Line) else Line(item)
        glossed = self._glossary.apply(line, f"line {number + 1}")
        return glossed if glossed.terms or isinstance(item, Line) else item

    def _request(self, item: Item, number: int, o: Options) -> Request:
        """The one place a `Request` is built (request.py): what translating `item`, numbered
        `number` in its input from 0 (its samples' seed), asks of a search. Its controls are
        checked against the engine that takes them (engines.py) and segmented (controls.py);
        an error names the line."""
        codec = self.parts.codec
        if isinstance(item, Line | str):
            text = item if isinstance(item, str) else item.text
            source = tuple(codec.encode(text, o.tgt_lang))
        else:
            source = tuple(item)
        request = Request(source, number, start=codec.start(o.tgt_lang))
        controls = item.controls if isinstance(item, Line) else Controls()
        if not controls:
            return request
        never, longest = self.parts.model.specials.never_below, self._longest(request, o)
        segmented = engines.check_line(
            controls, o, self.parts.setup, codec.vocab.target.encode, never, longest,
            f"line {number + 1}",
        )  # fmt: skip
        return dataclasses.replace(request, controls=segmented)

    def _longest(self, request: Request, o: Options) -> int:
        """A request's longest output, EOS included (max_len_a/b, the model's limit)."""
        return request.longest(o.max_len_a, o.max_len_b, self._run.limit)

    def _search(self, requests: list[Request], o: Options) -> list[list[Hypothesis]]:
        """The hypotheses of each request, in order: sorted by source length into batches of
        decode.batch_tokens padded source tokens (batches.py), decoded by the runtime."""
        out: list[list[Hypothesis]] = [[] for _ in requests]
        p = self.parts
        mixed = engines.choose(Controls(), o, p.setup).mixed and p.model.capabilities.mixed_lengths
        limit = p.model.max_positions
        for batch, rows in request_batches(requests, p.batch_tokens, p.device, limit, mixed):
            for i, hyps in zip(rows, self._run(batch, o)):
                out[i] = hyps
        return self._aligned(requests, out, o.tgt_lang) if o.alignments else out

    def _aligned(
        self, requests: list[Request], hyps: list[list[Hypothesis]], tgt_lang: str | None
    ) -> list[list[Hypothesis]]:
        """The hypotheses with their word alignments (align.py), every hypothesis of every
        request read in one forced pass."""
        from mtx.decode.align import Aligner

        if tgt_lang not in self._aligners:
            self._aligners[tgt_lang] = Aligner(self.parts, tgt_lang)
        src = [list(r.source) for r, found in zip(requests, hyps) for _ in found]
        outputs = [h.tokens for found in hyps for h in found]
        links = iter(self._aligners[tgt_lang].word_links(src, outputs))
        return [
            [dataclasses.replace(h, links=tuple(sorted(next(links)))) for h in found]
            for found in hyps
        ]

    def _translation(
        self, item: Item, request: Request, hyps: list[Hypothesis], o: Options
    ) -> Translation:
        """A sentence's result (result.py) from its hypotheses, best first; a line with
        controls or glossary terms counted in `stats`, with a note where its constraints
        cannot fit its longest output."""
        detokenize = self.parts.codec.detokenize
        outputs = tuple(
            Output(detokenize(h.tokens), _float(h.score), _float(h.log_prob), h.unmet, h.links,
                   tuple(h.tokens))
            for h in hyps
        )  # fmt: skip
        notes: tuple[str, ...] = ()
        if isinstance(item, Line):
            self.stats.terms.count(item, outputs[0].text, outputs[0].unmet)
            longest = self._longest(request, o)
            if item.controls.constraints and not fits(request.controls, longest):
                self.stats.terms.unfit += 1
                notes = (
                    f"line {request.line + 1}: the prefix, constraints and EOS take "
                    f"{needed(request.controls)} pieces but its longest output is {longest}: "
                    f"{outputs[0].unmet} constraint(s) unmet",
                )
        attention = self._attention(request, hyps[0].tokens) if o.attention else None
        return Translation(outputs, bool(request.controls.alternatives), notes, attention)

    def _attention(self, request: Request, tokens: list[int]) -> Attention:
        """The encoder-decoder attention while the decoder reads output `tokens` for the
        request's source (teacher-forced: the weights the search saw for that output, up to
        rounding), read from beside the model (model/capture.py)."""
        model, device = self.parts.model, self.parts.device
        src = torch.tensor([list(request.source)], device=device)
        tgt_in = torch.tensor([[model.specials.start, *request.start, *tokens]], device=device)
        with torch.no_grad(), capture_cross_attention(model) as seen:
            memory, src_mask = model.encode(src)
            model.decode(tgt_in, memory, src_mask)
        n = len(request.start)
        weights = torch.stack([seen[i][0, :, n:] for i in sorted(seen)]).float().cpu()
        piece = self.parts.codec.piece
        return Attention(
            source=[piece(i) for i in request.source[:-1]] + ["</s>"],
            output=[piece(i) for i in tokens] + ["</s>"],
            weights=weights,
        )

    def _read(self, items: Iterable[Item], o: Options, first: int) -> documents.Sentences:
        settings = documents.settings_of(self.parts.config, o.format)
        texts = [x for x in items]
        if any(not isinstance(x, str | Line) for x in texts):
            raise MtxError(f"decode.format {o.format} reads text, not encoded ids")
        return documents.read(texts, settings, first, self._glossary)

    def _documents(self, items: Sequence[Item], o: Options, first: int) -> list[Translation]:
        """Each line read in its format, its sentences translated with every other line's,
        and put back together (documents.py); a sentence's word links read only where it has
        marks to put back."""
        sentences = self._read(items, o, first)
        plain = o.sentences()
        each = sentences.sentences
        requests = [self._request(s.item, s.number, plain) for s in each]
        hyps = self._search(requests, plain)
        marked = [k for k, s in enumerate(each) if s.links]
        if marked:
            aligned = self._aligned([requests[k] for k in marked], [hyps[k] for k in marked],
                                    o.tgt_lang)  # fmt: skip
            for k, found in zip(marked, aligned):
                hyps[k] = found
        outputs = [
            self._translation(s.item, r, found, plain).best
            for s, r, found in zip(each, requests, hyps)
        ]
        return documents.results(sentences, outputs)


def _words(item: Item) -> bool:
    """Whether an item has words to translate (encoded ids always have)."""
    if isinstance(item, str | Line):
        return bool((item if isinstance(item, str) else item.text).split())
    return True


def _float(x: float | None) -> float | None:
    return None if x is None else float(x)
