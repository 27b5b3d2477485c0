"""The decode and serve sections: the search, and the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mtx.config.fields import AT_LEAST_1, LAYER, NOT_NEGATIVE, POSITIVE, Range, setting
from mtx.errors import MtxError

# decode.placeholders, inline_tags and keep_tags by default (mtx/documents/ reads them)
PLACEHOLDERS = ("double_braces", "braces", "printf", "dollar", "xliff")
INLINE_TAGS = (
    "a", "abbr", "b", "bdi", "bdo", "big", "br", "cite", "code", "data", "del", "dfn", "em",
    "font", "i", "img", "ins", "kbd", "label", "mark", "q", "s", "samp", "small", "span",
    "strike", "strong", "sub", "sup", "time", "tt", "u", "var", "wbr",
    "g", "x", "ph", "bx", "ex", "it", "mrk",  # XLIFF's inline codes
)  # fmt: skip
KEEP_TAGS = ("script", "style", "pre", "code", "kbd", "samp", "var", "noscript", "template",
             "textarea", "svg", "math")  # fmt: skip


Stopping = Literal["k_finished", "exact", "never"]  # when a beam search ends a sentence
SearchMode = Literal["shrinking", "static", "graphs", "auto"]
Format = Literal["plain", "paragraphs", "html", "xml"]  # what a line is (mtx/documents/)
DType = Literal["auto", "fp32", "bf16", "fp16", "int8"]
# where alignments are read (decode/align.py)
AlignReading = Literal["auto", "full", "shift", "step"]


@dataclass
class DecodeConfig:
    """How `mtx translate`, `evaluate`, `serve` and validation BLEU decode (decode/)."""

    beam: int = setting(4, "beam size (1: greedy)", POSITIVE)
    alpha: float = setting(0.6, "length penalty ((5 + length) / 6) ** alpha", NOT_NEGATIVE)
    max_len_a: float = setting(1.0, "longest output = a x source length + b", NOT_NEGATIVE)
    max_len_b: int = setting(50, "see max_len_a", NOT_NEGATIVE)
    batch_tokens: int = setting(
        4096, "source-token budget of a translation batch", POSITIVE, neutral=True
    )
    stopping: Stopping = setting(
        "k_finished", "when a beam search ends a sentence (decode/search.py)"
    )
    search: SearchMode = setting(
        "auto",
        "shrinking: sentences leave the batch as they end (decode/search.py); static: fixed "
        "rows over a preallocated cache (decode/static.py); graphs: static, each step a CUDA "
        "graph (CUDA only); auto: graphs on CUDA, else shrinking. static and graphs take "
        "stopping k_finished, no sampling, one Transformer; auto falls back to shrinking",
    )
    sampling: bool = setting(False, "draw each token at random instead of searching")
    temperature: float = setting(1.0, "sampling: softmax(logits / temperature)", POSITIVE)
    top_k: int = setting(0, "sampling: only the k most probable tokens (0: all)", NOT_NEGATIVE)
    top_p: float = setting(
        1.0,
        "sampling: only the smallest set of tokens holding this much probability",
        Range(0, 1, low_open=True),
    )
    seed: int = setting(
        0, "sampling: line i of the input draws from the stream seeded by (seed, i)", NOT_NEGATIVE
    )
    dtype: DType = setting(
        "auto",
        "auto (bf16 on a GPU that has it, else fp32), fp32, bf16, fp16, or int8 (CPU only: "
        "int8 weights, inputs quantized row by row)",
    )
    alignments: bool = setting(
        False,
        "give each output's word alignment, Pharaoh i-j word indices (decode/align.py: a "
        "forced pass over the output, read at the guided heads or at align_layer)",
    )
    align_layer: int = setting(
        -1,
        "alignments of a model trained without guidance: the decoder layer read (negative: "
        "from the last; the last aligned best of every layer measured: BENCHMARKS.md), every "
        "head averaged",
        LAYER,
    )
    align_heads: list[int] = setting(
        [],
        "alignments: these heads of align_layer, averaged (empty: the guided heads of a model "
        "trained with train.align_weight, else every head)",
    )
    align_reading: AlignReading = setting(
        "auto",
        "alignments: where the attention is read (decode/align.py): full, a pass over the "
        "target without the causal mask (the pass train.align_context full trains in); step, "
        "the row that predicts the target token; shift, the row that reads it (Chen et al. "
        "2020's Shift-Att); auto: a head trained in full context by shift, any other by step "
        "(the better on every model measured: BENCHMARKS.md)",
    )
    align_threshold: float = setting(
        0.0,
        "alignments: a target word whose attention on its best source word (its pieces' mean) "
        "is below this is left unaligned, as is one that attends most to no word (EOS); 0: "
        "only those",
        Range(0, 1),
    )
    shortlist: str = setting(
        "",
        "a lexical shortlist (`mtx shortlist`): each sentence's next token is chosen among the "
        "target pieces likely for its source only (decode/shortlist.py; the shrinking search; "
        "empty: the whole vocabulary)",
    )
    draft: str = setting(
        "",
        "speculative decoding (decode/speculative.py): the checkpoint of a small model on the "
        "same vocabulary (a distilled student) whose drafts the model verifies, several tokens "
        "a call; greedy search's output exactly (beam 1, the shrinking search; empty: none)",
        neutral=True,
    )
    draft_tokens: int = setting(
        4, "speculative decoding: tokens drafted a call", POSITIVE, neutral=True
    )
    draft_adaptive: bool = setting(
        True,
        "speculative decoding: per batch size, time greedy search without drafts and with 1, 2, "
        "4... up to draft_tokens a call, and decode each batch the fastest way (decode/tuning.py;"
        " the output is the same whichever); false: always draft_tokens",
        neutral=True,
    )
    engine: str = setting(
        "auto",
        "what decodes (decode/engines.py): auto, the engine the other settings and each "
        "sentence's controls choose; or one by name: greedy, beam, sampling, static, graphs, "
        "drafts, constrained, alternatives, ctranslate2 (a CTranslate2 export: ct2_dir)",
    )
    ct2_dir: str = setting(
        "",
        "engine ctranslate2: the export it decodes with (empty: CHECKPOINT.ct2 beside the "
        "checkpoint; `mtx translate` and `mtx serve` make it when missing)",
    )

    format: Format = setting(
        "plain",
        "what a line is (mtx/documents/): plain, one sentence; paragraphs, sentences split and "
        "translated one by one; html or xml, markup whose block elements are paragraphs, "
        "inline elements and placeholders put back through the word alignment",
    )
    placeholders: list[str] = setting(
        list(PLACEHOLDERS),
        "with a format other than plain, pieces kept verbatim (documents/placeholders.py): "
        "double_braces {{x}}, braces {x}, printf %s %1$s, dollar $X ${X}, xliff <x/>, or "
        "re:REGEX",
    )
    inline_tags: list[str] = setting(
        list(INLINE_TAGS),
        "html and xml: elements of running text, put back around the translated words "
        "(any element with text around it is one too)",
    )
    keep_tags: list[str] = setting(
        list(KEEP_TAGS),
        'html and xml: elements written back untranslated (also any with translate="no" '
        "or the class notranslate)",
    )

    def check(self) -> None:
        if any(h < 0 for h in self.align_heads):
            raise MtxError(f"decode.align_heads: heads are counted from 0, got {self.align_heads}")


@dataclass
class ServeConfig:
    """`mtx serve` (serve/): where it listens, its limits and its batching."""

    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = setting(
        8080, "TCP port (0: one the system picks, printed at start)", Range(0, 65535)
    )
    batching: bool = setting(True, "false: one request at a time, decoded alone (for comparison)")
    workers: int = setting(
        0,
        "decoding processes, each with its share of the cores (0: on the CPU one per core, at "
        "most 4; on a GPU 1)",
        NOT_NEGATIVE,
    )
    max_wait_ms: float = setting(
        5.0, "wait at most this long for more sentences to fill a batch", NOT_NEGATIVE
    )
    max_queue: int = setting(
        2048, "sentences waiting at most; a request beyond gets 503", AT_LEAST_1
    )
    max_texts: int = setting(256, "texts in one request at most (413 beyond)", AT_LEAST_1)
    max_chars: int = setting(4096, "characters in one text at most (413 beyond)", AT_LEAST_1)
    max_body_bytes: int = setting(
        1_000_000, "bytes in one request body at most (413 beyond)", AT_LEAST_1
    )
    max_beam: int = setting(8, "the largest beam (and n-best) a request may ask for", AT_LEAST_1)
    timeout_s: float = setting(60.0, "a request waiting longer gets 504", POSITIVE)
    drain_s: float = setting(
        30.0, "on SIGTERM: finish queued sentences within this, then 503 the rest", NOT_NEGATIVE
    )

    def check(self) -> None:
        if self.max_texts > self.max_queue:  # such a request could never be queued
            raise MtxError(
                f"serve.max_texts ({self.max_texts}) must not exceed serve.max_queue "
                f"({self.max_queue})"
            )
