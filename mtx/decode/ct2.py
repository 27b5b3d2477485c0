"""The `ctranslate2` engine (engines.py): a CTranslate2 export of the model decodes. Faster on
the CPU, but its search is CTranslate2's (its own length penalty and padding), so its outputs
may differ from mtx's and from one batch to the next; it gives no log-probabilities, word
alignments or attention. The export (`mtx export --format ctranslate2`, mtx/formats) is
`decode.ct2_dir`, or CHECKPOINT.ct2 beside the first checkpoint: `mtx translate` and `mtx
serve` make it there when it is missing or stale, before the translator is built.

mtx's rules of search (rules.py) are told to it: the longest output of the batch's longest
source (CTranslate2 counts no EOS), the tokens never produced, decode.alpha as its length
penalty.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mtx.decode import rules
from mtx.decode.options import Options
from mtx.decode.request import SearchBatch
from mtx.decode.rules import Hypothesis
from mtx.errors import MtxError


def export_dir(checkpoint: Path, ct2_dir: str = "") -> Path:
    """Where the export of `checkpoint` is: `ct2_dir` (decode.ct2_dir), or CHECKPOINT.ct2."""
    return Path(ct2_dir) if ct2_dir else checkpoint.with_name(checkpoint.stem + ".ct2")


def ct2_options(pieces: list[list[str]], o: Options, limit: int, specials, piece) -> dict:
    """CTranslate2's options for a batch of source pieces (EOS excluded) under options `o`,
    by mtx's rules: `limit` the longest output the model takes (EOS included), the pieces
    never produced (`specials`: the model's; `piece`: an id's piece)."""
    longest = rules.max_lengths(max(len(p) for p in pieces), o.max_len_a, o.max_len_b, limit)
    never = [piece(i) for i in rules.never_produced(specials)]
    return {
        "beam_size": o.beam,
        "num_hypotheses": o.nbest,
        "length_penalty": o.alpha,
        "max_decoding_length": longest - 1,
        "suppress_sequences": [[piece] for piece in never],
        "return_scores": True,
        "max_batch_size": len(pieces),
    }


def model(rt):
    """The runtime's CTranslate2 model, loaded on first use, and again when torch's thread
    count changed (CTranslate2's threads are fixed when its model is loaded)."""
    threads = torch.get_num_threads()
    if rt.ct2_model is None or rt.ct2_threads != threads:
        try:
            import ctranslate2
        except ImportError:
            raise MtxError(
                "decode.engine ctranslate2 needs the ctranslate2 package: pip install "
                "'mtx[serve,export]'"
            ) from None
        if not rt.checkpoints:
            raise MtxError("decode.engine ctranslate2 decodes the export of a checkpoint")
        directory = export_dir(rt.checkpoints[0], rt.d.ct2_dir)
        if not (directory / "model.bin").is_file():
            raise MtxError(
                f"decode.engine ctranslate2: no CTranslate2 model in {directory} (mtx export "
                "--format ctranslate2 makes one)"
            )
        rt.ct2_model = ctranslate2.Translator(
            str(directory), device="cpu", intra_threads=threads, inter_threads=1
        )
        rt.ct2_threads = threads
    return rt.ct2_model


def translate_batch(rt, batch: SearchBatch, o: Options) -> list[list[Hypothesis]]:
    """The hypotheses CTranslate2 gives each request of `batch`, best first (its scores; no
    log-probabilities)."""
    codec = rt.codec
    pieces = [[codec.piece(i) for i in r.source[:-1]] for r in batch.requests]
    asked = ct2_options(pieces, o, rt.limit, rt.model.specials, codec.piece)
    results = model(rt).translate_batch(pieces, **asked)
    out = []
    for r in results:
        ids = [[codec.vocab.piece_to_id(x) for x in h] for h in r.hypotheses]
        out.append([Hypothesis(h, float(s), None) for h, s in zip(ids, r.scores)])
    return out
