"""Typed configuration: a tree of dataclasses, loaded from YAML, overridden by `--set key=value`.

Each field declares everything about itself in one place (`setting`): its type (`Literal` for
a choice of words), its default, a one-line description and, for a number, its range. One
generic function (`check_fields`) checks every field against its declaration and writes the
one-line error; only the rules that tie several fields together are written by hand (each
section's `check`, and `Config.validate` for those that span sections). The CLI's help and
docs/config.md (`markdown`) are generated from the same declarations.

An unknown key is an error naming the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mtx import corpora
from mtx.errors import MtxError
from mtx.tokens import bucket_length


@dataclass(frozen=True)
class Range:
    """The numbers a field accepts: from `low` to `high` (either may be open-ended: None),
    each bound included unless its `*_open` flag says otherwise. NaN and infinities never are."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and not (
            value > self.low or (value == self.low and not self.low_open)
        ):
            return False
        return self.high is None or value < self.high or (value == self.high and not self.high_open)

    def describe(self, integer: bool) -> str:
        """The range in words, as the error says it: 'positive', '0 or more', 'in [0, 1)'."""
        low, high = self.low, self.high
        if high is None:
            if low == 0:
                return "positive" if self.low_open else "0 or more"
            return f"at least {low:g}"
        if integer and not (self.low_open or self.high_open):
            return f"in {low:g}..{high:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{low:g}, {high:g}{right}"


POSITIVE = Range(0, low_open=True)
NOT_NEGATIVE = Range(0)
AT_LEAST_1 = Range(1)
FRACTION = Range(0, 1, high_open=True)  # dropout, label smoothing, Adam's betas


def setting(default: Any, doc: str, range: Range | None = None) -> Any:
    """A config field: its default, a one-line description and, for a number, its range."""
    metadata = {"doc": doc, "range": range}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# --- the sections -------------------------------------------------------------------------

Part = Literal["embeddings", "encoder", "decoder"]  # what train.freeze names (each model's parts)
PARTS: tuple[str, ...] = typing.get_args(Part)
AttentionScore = Literal["additive", "general", "dot", "scaled_dot", "location"]
ATTENTION_SCORES: tuple[str, ...] = typing.get_args(AttentionScore)

SPLIT_DOC = (
    "a local prefix P (files P.{src_lang} and P.{tgt_lang}), a hub dataset "
    "hf:NAME[:CONFIG[:SPLIT]], or the embedded corpus toy:SPLIT"
)


VALID_DOC = (
    "validation sets, each SPEC or NAME=SPEC (SPEC as train); several are each reported by "
    "name, and train.best_valid picks what best.pt and patience follow"
)


@dataclass
class CorpusConfig:
    """One entry of data.corpora: a direction's parallel data (mtx/corpora.py)."""

    src_lang: str = setting("", "source language code; local files are PREFIX.{src_lang}")
    tgt_lang: str = setting("", "target language code; local files are PREFIX.{tgt_lang}")
    train: str = setting("", f"the training split: {SPLIT_DOC}")
    valid: list[str] = setting([], VALID_DOC)
    test: str = setting("", "the test split (as train; empty: none)")
    name: str = setting("", "what its scores are reported as (default: SRC-TGT)")
    weight: float = setting(
        1.0, "factor on its share of the training batches (after data.corpus_temperature)", POSITIVE
    )


@dataclass
class CleanConfig:
    """data.clean: the rules that drop noisy training pairs (mtx/data/clean.py, docs/data.md);
    each drop is counted by its reason and written to RUN/prepared/dropped.tsv."""

    langid: float = setting(
        0.5,
        "drop a pair when a side is identified (py3langid) as another language than declared "
        "with at least this probability (0: off)",
        Range(0, 1),
    )
    copy: float = setting(
        0.9,
        "drop a pair when at least this share of the target's normalised words are the "
        "source's: an untranslated copy (0: off)",
        Range(0, 1),
    )
    numbers: bool = setting(True, "drop a pair whose two sides hold different numbers")
    nontext: bool = setting(
        True, "drop a pair with control, replacement, private-use or unassigned characters"
    )
    markup: bool = setting(
        True, "drop a pair with HTML entities, tags that do not nest, or different tags"
    )
    max_nonletters: float = setting(
        0.5,
        "drop a pair when more than this share of a side's characters (spaces aside) are "
        "not letters (1: off)",
        Range(0, 1),
    )
    lexical: float = setting(
        0.25,
        "drop a pair when, on average over its two directions, less than this share of its "
        "words (weighted by rarity) find a translation on the other side, the translations "
        "learnt from the corpus itself: a misaligned pair (data/lexical.py; parts of 10,000 "
        "pairs or more; 0: off)",
        Range(0, 1),
    )
    dual_forward: str = setting(
        "",
        "dual conditional cross-entropy filtering: a checkpoint translating src_lang -> "
        "tgt_lang, trained on clean data (empty: off)",
    )
    dual_backward: str = setting(
        "",
        "its backward model, tgt_lang -> src_lang (empty: dual_forward, which must then "
        "translate both ways, with language tags)",
    )
    dual_threshold: float = setting(
        0.0,
        "keep pairs whose dual score |H_f - H_b| + (H_f + H_b) / 2 (nats per token) is at "
        "most this (0: use dual_keep)",
        NOT_NEGATIVE,
    )
    dual_keep: float = setting(
        0.9, "without dual_threshold: the share of pairs kept, the best-scored", Range(0, 1, True)
    )


@dataclass
class DataConfig:
    """What `mtx prepare` reads and how it encodes it."""

    src_lang: str = setting("en", "source language code; local files are PREFIX.{src_lang}")
    tgt_lang: str = setting("de", "target language code; local files are PREFIX.{tgt_lang}")
    train: str = setting("toy:train", f"the training split: {SPLIT_DOC}")
    valid: list[str] = setting(["toy:valid"], VALID_DOC)
    test: str = setting("toy:test", "the test split (as data.train)")
    corpora: list[CorpusConfig] = setting(
        [],
        "several directions or corpora in one model, each {src_lang, tgt_lang, train, valid, "
        "test, name, weight} (the keys below); replaces data.src_lang, tgt_lang, train, valid "
        "and test. With more than one target language the source starts with a tag >>xx<< "
        "naming the target language (docs/data.md)",
    )
    corpus_temperature: float = setting(
        1.0,
        "data.corpora: corpus i makes a share of each epoch's pairs proportional to "
        "weight_i x n_i ** (1 / temperature) (1: as many as it has; 5: small corpora "
        "upsampled, as multilingual models are trained); also balances the SentencePiece sample",
        AT_LEAST_1,
    )
    vocab_size: int = setting(
        8000, "joint SentencePiece BPE vocabulary size (a soft limit)", POSITIVE
    )
    max_len: int = setting(
        250, "drop training pairs with more subwords than this on either side", POSITIVE
    )
    max_ratio: float = setting(
        3.0, "drop training pairs whose length ratio exceeds this", AT_LEAST_1
    )
    dedup: Literal["false", "true", "normalised"] = setting(
        "normalised",
        "drop repeated training pairs: true, exact repeats; normalised, also those that "
        "differ only in case, punctuation and whitespace (the first is kept)",
    )
    clean: CleanConfig = field(default_factory=CleanConfig, metadata={"section": True})
    spm_sample: int = setting(
        2_000_000, "sentences sampled to train SentencePiece (0: all)", NOT_NEGATIVE
    )
    character_coverage: float = setting(
        1.0, "SentencePiece's character coverage", Range(0, 1, low_open=True)
    )
    spm_model: str = setting(
        "",
        "encode with this SentencePiece model (a .model file, or a checkpoint, which embeds "
        "one) instead of training one: to fine-tune on new data (vocab_size is then unused)",
    )
    workers: int = setting(0, "processes that encode the data (0: one per CPU core)", NOT_NEGATIVE)
    bpe_dropout: float = setting(
        0.0,
        "BPE-dropout on the fly: each epoch, training pairs are segmented anew, each possible "
        "merge left out with this probability (0: off; 0.1 as Provilkov et al.), by (seed, "
        "epoch, pair) alone; never in validation or translation (data/bpe_dropout.py)",
        FRACTION,
    )

    def check(self) -> None:
        corpora.corpora(self)  # every rule about the corpora and their sets, in one line each


@dataclass
class ModelConfig:
    """The network (model/): the paper's Transformer, its variants, or the recurrent baseline."""

    d_model: int = setting(512, "model width", POSITIVE)
    d_ff: int = setting(2048, "inner width of the position-wise feed-forward network", POSITIVE)
    n_heads: int = setting(8, "attention heads; d_k = d_v = d_model / n_heads", POSITIVE)
    encoder_layers: int = setting(6, "encoder stack depth", POSITIVE)
    decoder_layers: int = setting(6, "decoder stack depth", POSITIVE)
    decoder_d_ff: int = setting(
        0,
        "feed-forward inner width of the decoder layers (0: d_ff); students narrow it",
        NOT_NEGATIVE,
    )
    decoder_self: Literal["attention", "ssru"] = setting(
        "attention",
        "how a decoder layer reads the positions before it: self-attention (the paper) or an "
        "SSRU, a simpler simple recurrent unit (Kim et al. 2019; fast students' decoders)",
    )
    output_bias: bool = setting(
        False,
        "a trained bias on the pre-softmax logits (the paper has none; MarianMT's "
        "final_logits_bias)",
    )
    activation: Literal["relu", "swish", "gelu"] = setting(
        "relu",
        "the feed-forward layers' activation: relu (the paper), swish (x sigmoid(x), OPUS-MT's "
        "MarianMT models) or gelu (the exact, erf form: NLLB's)",
    )
    decoder_start: Literal["bos", "pad", "eos"] = setting(
        "bos",
        "the decoder's first input: bos (mtx's vocabularies), pad (an imported MarianMT model: "
        "its vocabulary has no BOS, id 2 is a piece) or eos (an imported NLLB model)",
    )
    dropout: float = setting(
        0.1, "on sublayer outputs and on embedding + position sums (the paper's)", FRACTION
    )
    attention_dropout: float = setting(0.0, "on attention weights (not in the paper)", FRACTION)
    init: Literal["fairseq", "xavier"] = setting(
        "fairseq",
        "Transformer weights: fairseq (Q/K/V Xavier with gain 1/sqrt(2), feed-forward layers "
        "and Q/K/V biases as torch's nn.Linear; it learns more per update) or xavier (every "
        "matrix Xavier, zero biases); the paper does not say",
    )
    max_positions: int = setting(
        1024, "length of the position table (the longest sequence)", POSITIVE
    )
    layer_norm_eps: float = setting(1e-5, "LayerNorm epsilon", POSITIVE)
    norm: Literal["post", "pre"] = setting(
        "post", "residual placement: post (the paper: LN(x + f(x))) or pre (x + f(LN(x)))"
    )
    positions: Literal["sinusoidal", "fairseq", "learned", "relative"] = setting(
        "sinusoidal",
        "sinusoidal (the paper), fairseq (fairseq's sinusoidal table, counted from 2: NLLB's), "
        "learned, or relative (Shaw et al.)",
    )
    max_relative_position: int = setting(
        16, "relative positions: distances clipped to [-k, k]", NOT_NEGATIVE
    )
    arch: Literal["transformer", "rnn"] = setting(
        "transformer",
        "transformer (the paper) or rnn (an attentional RNN, Luong et al., which uses d_model, "
        "the layer counts, dropout and max_positions, and the rnn_* and attention keys)",
    )
    rnn_cell: Literal["lstm", "gru"] = setting("lstm", "rnn: the recurrent cell")
    attention: AttentionScore = setting("general", "rnn: how attention scores are computed")

    def check(self) -> None:
        m = self
        if m.arch == "transformer" and m.d_model % m.n_heads:
            raise MtxError(
                f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})"
            )
        if m.arch != "rnn":
            return
        if m.d_model % 2:
            raise MtxError(
                f"model.d_model ({m.d_model}) must be even with model.arch rnn (each "
                "direction of the bidirectional encoder has d_model / 2 units)"
            )
        transformer = ("norm", "positions", "init", "decoder_d_ff", "decoder_self", "activation")
        for key in (*transformer, "output_bias"):
            value, default = getattr(m, key), getattr(ModelConfig, key)
            if value != default:
                raise MtxError(f"model.{key} ({value}) is a transformer setting; model.arch is rnn")


@dataclass
class TrainConfig:
    """`mtx train` (train/): batches, optimizer, schedule, validation, checkpoints, devices."""

    max_tokens: int = setting(
        4096, "token budget of a batch (longest padded length x sentences, per side)", POSITIVE
    )
    update_freq: int = setting(1, "batches accumulated into one update", POSITIVE)
    lr_scale: float = setting(
        1.0, "factor on the paper's learning-rate formula (0: a learning rate of 0)", NOT_NEGATIVE
    )
    warmup_steps: int = setting(
        4000, "linear warm-up steps of the inverse-sqrt schedule", AT_LEAST_1
    )
    max_steps: int = setting(100_000, "stop after this many updates", POSITIVE)
    max_minutes: float = setting(
        0.0, "stop after this many minutes of training (0: no limit)", NOT_NEGATIVE
    )
    label_smoothing: float = setting(0.1, "epsilon of label-smoothed cross-entropy", FRACTION)
    adam_beta1: float = setting(0.9, "Adam beta1", FRACTION)
    adam_beta2: float = setting(0.98, "Adam beta2", FRACTION)
    adam_eps: float = setting(1e-9, "Adam epsilon", POSITIVE)
    clip_norm: float = setting(
        0.0, "clip the gradient norm to this (0: off, as in the paper)", NOT_NEGATIVE
    )
    seed: int = setting(1, "seeds initialisation, dropout and batch order", NOT_NEGATIVE)
    valid_every: int = setting(1000, "validate and checkpoint every this many updates", POSITIVE)
    bleu_every: int = setting(
        1,
        "translate the validation split with decode.* and score it (BLEU, chrF) at every this "
        "many validations, and at the last (0: never, loss only)",
        NOT_NEGATIVE,
    )
    valid_bleu_lines: int = setting(
        0, "translate only the first N validation lines (0: all)", NOT_NEGATIVE
    )
    best_metric: Literal["loss", "bleu"] = setting(
        "loss", "what best.pt is best by: loss (lowest) or bleu (highest)"
    )
    patience: int = setting(
        0, "stop after this many validations without a better best_metric (0: off)", NOT_NEGATIVE
    )
    best_valid: str = setting(
        "",
        "with several validation sets: the one whose best_metric best.pt and patience follow "
        "(empty: the mean over the sets)",
    )
    tensorboard: bool = setting(
        False, "also write every metric to RUN/tensorboard (pip install tensorboard)"
    )
    keep_last: int = setting(
        5, "step checkpoints (step-N.pt) kept beside last.pt and best.pt", NOT_NEGATIVE
    )
    max_nonfinite: int = setting(
        10, "stop after this many updates in a row with a NaN/inf loss or gradient", POSITIVE
    )
    max_oom: int = setting(
        3, "stop after this many batches in a row run out of GPU memory", POSITIVE
    )
    log_every: int = setting(100, "write a metrics line every this many updates", POSITIVE)
    device: str = setting("auto", "auto (CUDA if present), cpu, cuda or cuda:N")
    precision: Literal["auto", "fp32", "bf16", "fp16", "bf16-weights"] = setting(
        "auto",
        "auto (bf16 autocast on GPUs that have it, else fp32), fp32, bf16, fp16 (autocast "
        "with dynamic loss scaling, for GPUs without bf16), or bf16-weights (bf16 parameters "
        "and activations, fp32 master weights in Adam: train/master.py)",
    )
    compile: Literal["auto", "true", "false"] = setting(
        "auto", "torch.compile the step: auto (on CUDA only), true or false"
    )
    compile_backend: Literal["inductor", "aot_eager", "eager"] = setting(
        "inductor",
        "torch.compile's backend: inductor (generated kernels); aot_eager or eager trace the "
        "step but run torch's own kernels (quick checks that it compiles)",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = setting(
        "default",
        "torch.compile's mode with inductor: default, reduce-overhead (CUDA graphs, one per "
        "batch shape) or max-autotune-no-cudagraphs (searches kernels: slow to compile)",
    )
    pad_to: int = setting(
        8,
        "pad each side of a batch to a length from a bounded set: a multiple of up to this many "
        "tokens, never more than 1/8 of the length (1: exact lengths)",
        POSITIVE,
    )
    static_shapes: bool = setting(
        False,
        "batches of a fixed set of shapes: per padded length L, max_tokens // L pairs (the "
        "last batch of a length filled with empty pairs), both sides padded to L; compiled "
        "with compile_mode reduce-overhead, a CUDA graph per shape (train/compiled.py)",
    )
    workers: int = setting(
        1, "background processes building batches (0: in the training process)", NOT_NEGATIVE
    )
    init_from: str = setting(
        "",
        "fine-tuning: start from this checkpoint's weights, with a fresh optimizer at step 0 "
        "and this run's schedule; model.* keys left out of the config come from it",
    )
    init_keep_optimizer: bool = setting(
        False, "init_from: keep its Adam moments (last.pt, step-N.pt)"
    )
    init_keep_step: bool = setting(
        False, "init_from: continue its step count, and so its learning rate"
    )
    init_parts: list[Part] = setting(
        list(PARTS),
        "init_from: the parts whose weights are taken; the others start from this run's own "
        "initialisation and may differ in shape (a student taking its teacher's embeddings "
        "and encoder)",
    )
    freeze: list[Part] = setting(
        [], "parts left as they are: embeddings (shared with the output layer), encoder, decoder"
    )
    ema: float = setting(
        0.0,
        "exponential moving average of the weights: its decay per update (e.g. 0.9999; 0: "
        "off); validation, best.pt and every checkpoint's weights are the average "
        "(train/ema.py)",
        FRACTION,
    )
    threads: int = setting(0, "CPU threads for torch (0: torch's default)", NOT_NEGATIVE)
    dist_timeout: float = setting(
        60.0,
        "torchrun: a collective that waits this many seconds fails and ends the job (a process "
        "died or hangs); raise it where rank 0 writes large checkpoints to a slow disk",
        POSITIVE,
    )

    def check(self) -> None:
        t = self
        if t.ema and t.precision == "bf16-weights":
            raise MtxError("train.ema averages fp32 weights: it does not take bf16-weights")
        if t.best_metric == "bleu" and t.bleu_every == 0:
            raise MtxError("train.best_metric bleu needs train.bleu_every above 0")
        if set(t.freeze) == set(PARTS):
            raise MtxError("train.freeze: every part is frozen, so nothing would be trained")
        if (t.init_keep_optimizer or t.init_keep_step) and not t.init_from:
            raise MtxError(
                "train.init_keep_optimizer and train.init_keep_step need train.init_from"
            )
        if not t.init_parts:
            raise MtxError("train.init_parts: name at least one part (or leave out init_from)")
        if set(t.init_parts) != set(PARTS) and not t.init_from:
            raise MtxError("train.init_parts needs train.init_from")
        if set(t.init_parts) != set(PARTS) and t.init_keep_optimizer:
            raise MtxError(
                "train.init_keep_optimizer keeps the Adam moments of every part: it needs "
                "train.init_parts to name them all"
            )


@dataclass
class DecodeConfig:
    """How `mtx translate`, `evaluate`, `serve` and validation BLEU decode (decode/)."""

    beam: int = setting(4, "beam size (1: greedy)", POSITIVE)
    alpha: float = setting(0.6, "length penalty ((5 + length) / 6) ** alpha", NOT_NEGATIVE)
    max_len_a: float = setting(1.0, "longest output = a x source length + b", NOT_NEGATIVE)
    max_len_b: int = setting(50, "see max_len_a", NOT_NEGATIVE)
    batch_tokens: int = setting(4096, "source-token budget of a translation batch", POSITIVE)
    stopping: Literal["k_finished", "exact", "never"] = setting(
        "k_finished", "when a beam search ends a sentence (decode/search.py)"
    )
    search: Literal["shrinking", "static", "graphs", "auto"] = setting(
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
    dtype: Literal["auto", "fp32", "bf16", "fp16", "int8"] = setting(
        "auto",
        "auto (bf16 on a GPU that has it, else fp32), fp32, bf16, fp16, or int8 (CPU only: "
        "int8 weights, inputs quantized row by row)",
    )
    shortlist: str = setting(
        "",
        "a lexical shortlist (`mtx shortlist`): each sentence's next token is chosen among the "
        "target pieces likely for its source only (decode/shortlist.py; the shrinking search; "
        "empty: the whole vocabulary)",
    )


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


@dataclass
class Config:
    """The whole config: the run directory and one section per part of mtx."""

    run_dir: str = setting("runs/default", "prepared data, checkpoints and metrics go here")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    # Not a setting: the keys the user wrote, in the file or with --set (None: every key).
    # train.init_from takes the model.* keys left out from its checkpoint (train/init.py).
    given: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def validate(self) -> Config:
        """Reject impossible settings with a message naming the key: every field against its
        declaration, each section's own rules, then those that tie sections together."""
        for section in SECTIONS:
            settings = getattr(self, section)
            check_fields(settings, f"{section}.")
            if hasattr(settings, "check"):
                settings.check()
        m, t, d = self.model, self.train, self.data
        if t.best_valid:
            names = [v.name for v in corpora.valid_sets(d)]
            if t.best_valid not in names:
                raise MtxError(
                    f"train.best_valid {t.best_valid!r} is not a validation set; they are "
                    f"{', '.join(names)}"
                )
        if d.bpe_dropout and t.static_shapes:
            raise MtxError(
                "data.bpe_dropout makes lengths change every epoch; train.static_shapes needs "
                "the prepared lengths: use one or the other"
            )
        # given, and not at its default (a config that mtx wrote out holds every key)
        single = ("src_lang", "tgt_lang", "train", "valid", "test")
        mixed = [
            f"data.{k}"
            for k in single
            if f"data.{k}" in (self.given or ()) and getattr(d, k) != getattr(DataConfig(), k)
        ]
        if d.corpora and mixed:
            raise MtxError(
                f"{mixed[0]} is given with data.corpora, which replaces it: name each "
                "corpus's languages and splits in its data.corpora entry"
            )
        if t.max_tokens < d.max_len + 1:
            raise MtxError(
                f"train.max_tokens ({t.max_tokens}) must hold one pair of data.max_len "
                f"({d.max_len}) tokens plus EOS"
            )
        longest = bucket_length(d.max_len + 1, t.pad_to)
        if longest > m.max_positions:
            raise MtxError(
                f"data.max_len ({d.max_len}) plus EOS, padded to {longest} tokens by "
                f"train.pad_to ({t.pad_to}), must fit model.max_positions ({m.max_positions})"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Every setting, as nested plain values (what config.yaml and checkpoints hold)."""
        return {
            f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if _is_key(f)
        }


SECTIONS = ("data", "model", "train", "decode", "serve")


def _is_key(f: dataclasses.Field) -> bool:
    """Whether a dataclass field is a config key or section (not bookkeeping like `given`)."""
    return "doc" in f.metadata or "section" in f.metadata or f.name in SECTIONS


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


# --- checking fields against their declarations -------------------------------------------


def _choices(tp: Any) -> tuple[str, ...] | None:
    """The words a Literal type allows (None for other types)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def _words(choices: tuple[str, ...]) -> str:
    if len(choices) > 4:
        return "one of " + ", ".join(choices)
    return ", ".join(choices[:-1]) + " or " + choices[-1]


def check_fields(settings: Any, prefix: str) -> None:
    """MtxError naming the first field of `settings` whose value is outside its declared
    choices or range."""
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        if "section" in f.metadata:  # a section inside a section: data.clean
            check_fields(getattr(settings, f.name), f"{prefix}{f.name}.")
        if "doc" not in f.metadata:
            continue
        key, value, tp = prefix + f.name, getattr(settings, f.name), hints[f.name]
        choices = _choices(tp)
        if choices is not None and value not in choices:
            raise MtxError(f"{key} must be {_words(choices)}, got {value!r}")
        item_type = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        item_choices = _choices(item_type) if item_type is not None else None
        for item in value if item_choices else ():
            if item not in item_choices:
                raise MtxError(f"{key}: {item!r} is not one of {', '.join(item_choices)}")
        for i, item in enumerate(value if dataclasses.is_dataclass(item_type) else ()):
            check_fields(item, f"{key}[{i}].")
        valid = f.metadata["range"]
        if valid is not None and value not in valid:
            raise MtxError(f"{key} must be {valid.describe(tp is int)}, got {value}")


def _type_name(tp: Any) -> str:
    return "str" if _choices(tp) is not None else getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any, raw: str | None) -> Any:
    """Check `value` against the field type `tp`; `raw` is the --set text, if any."""
    if _choices(tp) is not None:
        tp = str  # the choice itself is checked with the ranges (check_fields)
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
    if dataclasses.is_dataclass(item):  # a list of mappings, each checked as a section
        if not isinstance(value, list):
            raise MtxError(f"config key {key} must be a list of mappings, got {value!r}")
        items = []
        for i, entry in enumerate(value):
            if not isinstance(entry, dict):
                raise MtxError(f"config key {key}[{i}] must be a mapping, got {entry!r}")
            items.append(item())
            _apply(items[-1], entry, f"{key}[{i}].")
        return items
    if typing.get_origin(tp) is list:  # a YAML list, or "a,b" on the command line
        if isinstance(value, str):
            value = [x.strip() for x in value.split(",") if x.strip()]
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # `compile: true` in YAML, for a key that takes a word
            return str(value).lower()
        if raw is not None:  # `--set run_dir=123` means the string "123"
            return raw
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-9 as a string
            try:
                return float(value)
            except ValueError:
                pass
    raise MtxError(f"config key {key} expects {_type_name(tp)}, got {value!r}")


# --- keys, YAML and --set -----------------------------------------------------------------

# Keys renamed, old -> new (within one section): a config file or --set may still use the old
# name, with a one-line notice; a checkpoint's saved config is read silently.
RENAMED = {
    "data.sampling": "data.bpe_dropout",  # decode.sampling is the search's
    "data.temperature": "data.corpus_temperature",  # decode.temperature is the search's
}

Notice = typing.Callable[[str], None]


def _current(key: str, notice: Notice | None) -> str:
    """The key's current name; a renamed key is noticed, when `notice` is given."""
    new = RENAMED.get(key)
    if new is None:
        return key
    if notice is not None:
        notice(f"mtx: config key {key} is now {new}; the old name will be removed")
    return new


def _unknown(key: str) -> MtxError:
    if "[" in key:  # a key inside a list entry: data.corpora[0].trian
        head, _, name = key.rpartition(".")
        keys = [f"{head}.{k}" for k, _, _ in declared(CorpusConfig)]
        close = difflib.get_close_matches(key, keys, n=1)
        return MtxError(
            f"unknown config key {key}" + (f" (did you mean {close[0]}?)" if close else "")
        )
    close = difflib.get_close_matches(key, all_keys(), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return MtxError(f"unknown config key {key}{hint}")


def declared(cls: type = Config, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """(dotted key, type, field) of every setting of the config tree, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from declared(tp, f"{prefix}{f.name}.")
        elif _is_key(f):
            yield prefix + f.name, tp, f


def all_keys() -> list[str]:
    """Every dotted key of the config tree, e.g. `model.d_model`."""
    return [key for key, _, _ in declared()]


def _apply(
    obj: Any, values: dict[str, Any], prefix: str = "", notice: Notice | None = None
) -> None:
    hints = typing.get_type_hints(type(obj))
    fields = {f.name: f for f in dataclasses.fields(obj) if _is_key(f)}
    for name, value in values.items():
        key = _current(f"{prefix}{name}", notice)
        name = key.removeprefix(prefix)
        if name not in fields:
            raise _unknown(key)
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise MtxError(f"config key {key} must be a mapping, got {value!r}")
            _apply(getattr(obj, name), value, key + ".", notice)
        else:
            setattr(obj, name, _coerce(key, value, tp, None))


def set_key(cfg: Config, key: str, raw: str, notice: Notice | None = None) -> None:
    """Apply one `--set key=value` override (value parsed as YAML, checked against the field)."""
    key = _current(key, notice)
    types = {k: tp for k, tp, _ in declared()}
    if key not in types:
        raise _unknown(key)
    *path, name = key.split(".")
    obj: Any = cfg
    for part in path:
        obj = getattr(obj, part)
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    setattr(obj, name, _coerce(key, value, types[key], raw))


def from_dict(values: dict[str, Any], notice: Notice | None = None) -> Config:
    cfg = Config()
    _apply(cfg, values, notice=notice)
    return cfg


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, notice: Notice = _stderr
) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply overrides, validate; a
    renamed key still works, and `notice` says so in one line."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise MtxError(f"config file not found: {p}")
        try:
            values = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise MtxError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(values, dict):
            raise MtxError(f"{p}: the top level must be a mapping of config keys")
    try:
        cfg = from_dict(values, notice)
    except MtxError as e:
        raise MtxError(f"{p}: {e}") from None
    apply_overrides(cfg, overrides, notice)
    given = [*_dotted(values), *(o.split("=", 1)[0].strip() for o in overrides or [])]
    cfg.given = frozenset(RENAMED.get(key, key) for key in given)
    return cfg.validate()


def _dotted(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in values.items():
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{name}.")
        else:
            yield prefix + name


def apply_overrides(
    cfg: Config, overrides: list[str] | None, notice: Notice | None = _stderr
) -> Config:
    for item in overrides or []:
        if "=" not in item:
            raise MtxError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        set_key(cfg, key.strip(), raw, notice)
    return cfg


# --- the declarations as help and documentation -------------------------------------------


def describe(key: str) -> str:
    """One line for a key: its description, and its choices or range."""
    for k, tp, f in declared():
        if k == key:
            allowed = _allowed(tp, f)
            return f.metadata["doc"] + (f" ({allowed})" if allowed else "")
    raise KeyError(key)


def _allowed(tp: Any, f: dataclasses.Field) -> str:
    """What a field accepts, in words: its choices or its range ("" for any string)."""
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
    choices = _choices(tp) or (_choices(item) if item is not None else None)
    if choices:
        return _words(choices) if item is None else "any of " + ", ".join(choices)
    valid = f.metadata.get("range")
    return valid.describe(tp is int) if valid else ""


def _type_word(tp: Any) -> str:
    if _choices(tp) is not None:
        return "choice"
    if typing.get_origin(tp) is list:
        item = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item):
            return "list of mappings"
        return "list of choices" if _choices(item) else "list"
    return getattr(tp, "__name__", str(tp))


def _yaml(value: Any) -> str:
    """A default as YAML writes it (`true`, `[]`, `1.0e-09`)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def markdown() -> str:
    """docs/config.md: how configs work, then every key: its type, default, choices or range,
    and description."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from mtx/config.py by `make config-doc`; a test fails when it is stale. -->",
        "",
        "A config is a YAML file of the sections below; a key left out keeps its default.",
        "Every key can also be set on the command line, `--set key=value` (repeatable), after",
        "the file; a value is read as YAML (`--set train.freeze=[encoder]`). An unknown key",
        "(with the closest valid one), a value of the wrong type, a word that is not one of a",
        "key's choices or a number outside its range is refused in one line naming the key.",
        "A checkpoint embeds its resolved config, so `translate`, `evaluate` and `serve` take",
        "`--set` over it (`--set decode.beam=8`).",
        "",
        "```yaml",
        "run_dir: runs/multi30k",
        "data: {train: data/multi30k/train, valid: data/multi30k/val,",
        "       test: data/multi30k/test2016, vocab_size: 8000}",
        "model: {d_model: 256, d_ff: 1024, n_heads: 4, encoder_layers: 3, decoder_layers: 3}",
        "train: {max_tokens: 4096, warmup_steps: 4000, lr_scale: 2.0}",
        "```",
        "",
        "The shipped configs: `configs/toy.yaml` (the demo: the toy corpus, a small model, 800",
        "updates at most), `configs/multi30k.yaml` (Multi30k en-de), `configs/base.yaml` and",
        "`configs/big.yaml` (the paper's base and big models on WMT14 en-de from the hub).",
    ]
    section = None
    for key, tp, f in declared():
        head = key.split(".")[0] if "." in key else ""
        if head != section:
            section = head
            lines += ["", f"## `{head}`" if head else "## Top level", ""]
            doc = type(getattr(Config(), head)).__doc__ if head else None
            lines += [" ".join(doc.split()), ""] if doc else []
            lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f.metadata["doc"].replace("|", "\\|")
        lines.append(
            f"| `{key}` | {_type_word(tp)} | `{_yaml(default)}` | {_allowed(tp, f)} | {text} |"
        )
        if key == "data.corpora":
            lines += _entry_rows("data.corpora[i].", CorpusConfig)
    lines += ["", "## Renamed keys", "", "Still read under their old names, with a notice:", ""]
    lines += [f"- `{old}`: now `{new}`" for old, new in RENAMED.items()]
    return "\n".join(lines) + "\n"


def _entry_rows(prefix: str, cls: type) -> list[str]:
    """The table rows of a list entry's keys (data.corpora[i].train, ...)."""
    rows = []
    for key, tp, f in declared(cls, prefix):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f.metadata["doc"].replace("|", "\\|")
        rows.append(
            f"| `{key}` | {_type_word(tp)} | `{_yaml(default)}` | {_allowed(tp, f)} | {text} |"
        )
    return rows
