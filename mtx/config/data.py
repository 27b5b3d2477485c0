"""The data section: the corpora, their cleaning and the SentencePiece model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mtx import corpora
from mtx.config.fields import AT_LEAST_1, FRACTION, NOT_NEGATIVE, POSITIVE, Range, setting

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
