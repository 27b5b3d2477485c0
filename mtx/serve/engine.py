"""What `mtx serve` decodes with: mtx's own search (the default, exact) or a CTranslate2 export.

An engine takes a list of texts and the request's choices (beam, n-best) and returns one
`Result` per text, in order; `decode_batch` adds the attention where a request asks for it.
Each engine lives in a decoding process of its own (workers.py), fed by one batcher worker
(batcher.py) one batch at a time, so it needs no locking.

`MtxEngine` is `Translator.translate_requests`, a request per text: the same search, settings
and batch independence as `mtx translate`, so a sentence gets the translation that `mtx
translate` gives it, whatever else is in its batch. `CT2Engine` runs a CTranslate2 export of
the checkpoint (mtx/formats): faster on the CPU, but its search is CTranslate2's (its own
length penalty and padding), so its outputs may differ from mtx's and from one batch to the
next. `describe_engine` tells the
server's own process, which holds no engine, what it needs to know of one (front.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mtx.decode import rules
from mtx.decode.controls import Line
from mtx.decode.result import Output, Translation
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.serve.front import About, Choices, Result, check_engine


class MtxEngine:
    name = "mtx"

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.cfg = translator.cfg
        self.single_model = translator.model.capabilities.attention  # not an Ensemble
        self._by_beam: dict[tuple[int, bool], Translator] = {}

    def length(self, text: str) -> int:
        """Source subwords of `text`, EOS included: what the token budget counts."""
        return len(self.translator.encode(text))

    def set_threads(self, n: int) -> None:
        torch.set_num_threads(n)

    def translate(
        self, texts: list[str | Line], beam: int, nbest: int, tgt_lang: str | None = None,
        alignments: bool = False,
    ) -> list[Result]:  # fmt: skip
        key = (beam, alignments)
        if key not in self._by_beam:
            # a draft (decode.draft) speeds up greedy search, not a beam's
            draft = self.cfg.decode.draft if beam == 1 else ""
            self._by_beam[key] = self.translator.with_decode(
                beam=beam, alignments=alignments, draft=draft
            )
        tr = self._by_beam[key].into(tgt_lang)
        # each text is line 0 of its own input: with decode.sampling its samples are seeded
        # alike in any batch (a position in the batch would make them depend on it)
        requests = [tr.request(text, 0) for text in texts]
        out = []
        for request, hyps in zip(requests, tr.translate_requests(requests, nbest)):
            translation = tr.translation(hyps, bool(request.controls.alternatives))
            out.append(Result(translation, list(hyps[0].tokens), len(request.source)))
        return out

    def attention(self, text: str, ids: list[int], tgt_lang: str | None = None) -> dict:
        """The encoder-decoder attention of the translation `ids` of `text`, averaged over
        decoder layers and heads: {"source": pieces, "output": pieces, "weights": rows}, one
        row per output subword (EOS last), one column per source subword (EOS last)."""
        return self.translator.into(tgt_lang).cross_attention(text, ids).to_json()


class CT2Engine:
    """A CTranslate2 export of one checkpoint (made on first use into `ct2_dir`, or CKPT.ct2
    beside the checkpoint; made again there when the checkpoint has changed)."""

    name = "ctranslate2"
    single_model = False  # no attention for the page

    def __init__(self, checkpoint: Path, translator: Translator, ct2_dir: Path | None) -> None:
        try:
            import ctranslate2
        except ImportError:
            raise MtxError(
                "--engine ctranslate2 needs the ctranslate2 package: pip install 'mtx[serve,export]'"
            ) from None
        self.ct2 = ctranslate2
        self.translator = translator  # its SentencePiece model and decode.* settings
        self.cfg = translator.cfg
        self.dir = ct2_dir or checkpoint.with_name(checkpoint.stem + ".ct2")
        from mtx.formats import ct2_export_of

        # made on first use; made again if the checkpoint changed since (refused in a
        # --ct2-dir the user named)
        ct2_export_of(checkpoint, self.dir, owned=ct2_dir is None)
        self.threads = 0
        self.set_threads(torch.get_num_threads())

    def set_threads(self, n: int) -> None:
        """CTranslate2's threads are fixed when its model is loaded: load it again."""
        if n != self.threads:
            self.model = self.ct2.Translator(
                str(self.dir), device="cpu", intra_threads=n, inter_threads=1
            )
            self.threads = n

    def translate(
        self, texts: list[str], beam: int, nbest: int, tgt_lang: str | None = None,
        alignments: bool = False,  # never asked: the server refuses it for this engine
    ) -> list[Result]:  # fmt: skip
        vocabulary = self.translator.vocab
        # a multilingual model's tag is a piece like any other (mtx/corpora.py)
        tr = self.translator.into(tgt_lang)
        pieces = [[vocabulary.id_to_piece(i) for i in tr.encode(t)[:-1]] for t in texts]
        results = self.model.translate_batch(pieces, **ct2_options(tr, pieces, beam, nbest))
        out = []
        for p, r in zip(pieces, results):
            ids = [[vocabulary.piece_to_id(x) for x in h] for h in r.hypotheses]
            outputs = tuple(Output(tr.detokenize(h), float(s)) for h, s in zip(ids, r.scores))
            out.append(Result(Translation(outputs), ids[0], len(p) + 1))
        return out

    def attention(self, text: str, ids: list[int], tgt_lang: str | None = None) -> dict:
        raise MtxError("the attention comes with --engine mtx only")


def ct2_options(tr: Translator, pieces: list[list[str]], beam: int, nbest: int) -> dict:
    """CTranslate2's options for a batch of source pieces, by mtx's rules (decode/rules.py):
    the longest output of the batch's longest source (CTranslate2 counts no EOS), the tokens
    never produced, decode.alpha as its length penalty."""
    d, limit = tr.cfg.decode, tr.model.max_positions - 1
    longest = rules.max_lengths(max(len(p) for p in pieces), d.max_len_a, d.max_len_b, limit)
    return {
        "beam_size": beam,
        "num_hypotheses": nbest,
        "length_penalty": d.alpha,
        "max_decoding_length": longest - 1,
        "suppress_sequences": [
            [tr.vocab.id_to_piece(i)] for i in rules.never_produced(tr.model.specials)
        ],
        "return_scores": True,
        "max_batch_size": len(pieces),
    }


def make_engine(
    name: str, checkpoints: list[Path], overrides: list[str], device: str, ct2_dir: Path | None
) -> MtxEngine | CT2Engine:
    check_engine(name, len(checkpoints), device)
    translator = Translator.from_checkpoints(checkpoints, overrides, device)
    if translator.cfg.decode.sampling:
        raise MtxError("mtx serve runs the search: set decode.sampling=false")
    if name == "ctranslate2":
        os.environ.setdefault("CT2_VERBOSE", "-1")
        return CT2Engine(checkpoints[0], translator, ct2_dir)
    return MtxEngine(translator)


def describe_engine(
    engine: MtxEngine | CT2Engine, checkpoints: list[Path], overrides: list[str]
) -> About:
    """What the server's own process needs to know of `engine` (front.py)."""
    from mtx.info import describe
    from mtx.model.transformer import count_parameters

    tr = engine.translator
    models = tr.model.members()  # an Ensemble's, in --checkpoint order
    return About(
        engine=engine.name,
        cfg=engine.cfg,
        spm_proto=tr.vocab.blob,
        max_positions=tr.model.max_positions,  # what Translator.encode cuts sources to
        single_model=engine.single_model,
        device=tr.device.type,
        checkpoints=[
            describe(str(path), overrides, parameters=count_parameters(model)).to_json()
            for path, model in zip(checkpoints, models)
        ],
    )


def decode_batch(
    engine: MtxEngine | CT2Engine, texts: list[str | Line], choices: Choices
) -> list[Result]:
    """One batch: the translations, and their attention if the request asks for it."""
    results = engine.translate(
        texts, choices.beam, choices.nbest, choices.tgt_lang, choices.alignments
    )
    if choices.attention:
        for item, result in zip(texts, results):
            text = item if isinstance(item, str) else item.text
            result.attention = engine.attention(text, result.ids, choices.tgt_lang)
    return results
