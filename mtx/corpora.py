"""Several corpora in one model: the directions, their named validation and test sets, the
target-language tags, and how much of each epoch each corpus makes.

`data.corpora` lists the corpora; without it, data.src_lang/tgt_lang/train/valid/test are
the one corpus. A corpus is a direction's data (the same files may appear twice, languages
swapped, for both directions) with a weight; a fine-tuning run lists its new data and some
of the old at a lower weight.

The tag. With more than one target language, every source starts with one token, >>xx<<,
naming the language to translate into (Johnson et al. 2017; Marian's and OPUS-MT's
convention, which `MarianTokenizer` reads). It is on the source side rather than the
decoder's first token (fairseq's decoder-langtok) because there it is part of the input
alone: a batch of the search, of the server or of an export may mix target languages with
no change to the search, and CTranslate2 and transformers take it as text. Each tag is a
reserved SentencePiece piece (a user-defined symbol): never split, and never sampled apart.

Sampling by temperature. Corpus i of n_i pairs makes a share p_i of each epoch's pairs
proportional to weight_i x n_i ** (1 / T) (Arivazhagan et al. 2019): T = 1 keeps the
sizes' proportions, a larger T upsamples small corpora. An epoch has as many pairs as all
corpora together; corpus i gives round(p_i x N) of them, drawn without replacement while
it has enough (whole copies first when it has not), by a generator seeded by
(seed, epoch, i) alone: the same on every process and after a resume.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from mtx.errors import MtxError

NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a corpus's or a set's name
LANG = re.compile(r"[A-Za-z0-9_-]+")  # a language code: what a tag >>xx<< may hold
TAG = re.compile(r">>([A-Za-z0-9_-]+)<<")


@dataclass(frozen=True)
class EvalSet:
    """A named validation or test set of one direction."""

    name: str
    spec: str
    src_lang: str
    tgt_lang: str
    key: str = "data."  # its corpus's config keys: data. or data.corpora[i].

    @property
    def direction(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"

    @property
    def single(self) -> bool:
        """Whether it is from the config's one corpus (data.train, not data.corpora)."""
        return self.key == "data."


@dataclass(frozen=True)
class Corpus:
    name: str
    src_lang: str
    tgt_lang: str
    train: str
    valid: tuple[EvalSet, ...]
    test: EvalSet | None
    weight: float = 1.0
    key: str = "data."

    @property
    def direction(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"


def tag_piece(lang: str) -> str:
    return f">>{lang}<<"


def corpora(d) -> list[Corpus]:
    """The corpora data (a DataConfig) describes, checked: one line naming the key for any
    problem."""
    if d.corpora:
        entries = [(f"data.corpora[{i}].", c) for i, c in enumerate(d.corpora)]
    else:
        entries = [("data.", d)]
    out, names = [], set()
    for key, e in entries:
        name = getattr(e, "name", "") or f"{e.src_lang}-{e.tgt_lang}"
        for field in ("src_lang", "tgt_lang", "train"):
            if not getattr(e, field):
                raise MtxError(f"{key}{field} is empty")
        for field in ("src_lang", "tgt_lang"):
            if not LANG.fullmatch(getattr(e, field)):
                raise MtxError(
                    f"{key}{field} {getattr(e, field)!r}: a language code is letters, digits, "
                    "'-' and '_'"
                )
        if e.src_lang == e.tgt_lang:
            raise MtxError(f"{key}src_lang and {key}tgt_lang must differ")
        valid = tuple(_eval_sets(key, name, e.valid, e.src_lang, e.tgt_lang))
        test = EvalSet(name, e.test, e.src_lang, e.tgt_lang, key) if e.test else None
        for n in [name] + [v.name for v in valid]:
            if not NAME.fullmatch(n):
                raise MtxError(f"{key}: the name {n!r} must be letters, digits, '.', '-' and '_'")
        if name in names:
            raise MtxError(
                f"{key}name: two corpora are named {name!r}; give each a distinct data.corpora name"
            )
        names.add(name)
        weight = getattr(e, "weight", 1.0)
        out.append(Corpus(name, e.src_lang, e.tgt_lang, e.train, valid, test, weight, key))
    seen = [v.name for c in out for v in c.valid]
    if not seen:
        raise MtxError("data.valid: no validation set (name one, or one in data.corpora)")
    if len(set(seen)) != len(seen):
        twice = next(n for n in seen if seen.count(n) > 1)
        raise MtxError(f"data.valid: two validation sets are named {twice!r}")
    return out


def _eval_sets(key: str, corpus: str, specs: list[str], src: str, tgt: str) -> list[EvalSet]:
    """A corpus's validation sets: "SPEC" or "NAME=SPEC", named by the corpus when it has one
    set, else NAME or CORPUS.K."""
    out = []
    for k, spec in enumerate(specs):
        name, sep, rest = spec.partition("=")
        if sep and NAME.fullmatch(name):
            spec = rest
        else:
            name = corpus if len(specs) == 1 else f"{corpus}.{k + 1}"
        if not spec:
            raise MtxError(f"{key}valid: entry {k + 1} names no set")
        out.append(EvalSet(name, spec, src, tgt, key))
    return out


def valid_sets(d) -> list[EvalSet]:
    return [v for c in corpora(d) for v in c.valid]


def target_languages(d) -> list[str]:
    """The target languages of the corpora, sorted."""
    return sorted({c.tgt_lang for c in corpora(d)})


def tags(d) -> list[str]:
    """The reserved target-language pieces: one per target language when there are several,
    none for one."""
    langs = target_languages(d)
    return [tag_piece(lang) for lang in langs] if len(langs) > 1 else []


def tag_ids(sp) -> dict[str, int]:
    """{language: its tag's id} of a SentencePiece model (empty: an untagged model)."""
    out = {}
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            continue
        m = TAG.fullmatch(sp.id_to_piece(i))
        if m:
            out[m.group(1)] = i
    return out


def shares(sizes: list[int], weights: list[float], temperature: float) -> np.ndarray:
    """Each corpus's share of an epoch: weight_i x n_i ** (1 / T), normalised."""
    n = np.asarray(sizes, dtype=np.float64)
    p = np.asarray(weights, dtype=np.float64) * (n / n.sum()) ** (1.0 / temperature)
    return p / p.sum()


def epoch_rows(corpus_of_row: np.ndarray, p: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The rows (indices into the training data) that make epoch `epoch`, corpus by corpus:
    corpus i gives round(p_i x N) rows (see the module's doc)."""
    total = len(corpus_of_row)
    out = []
    for i, share in enumerate(p):
        rows = np.flatnonzero(corpus_of_row == i)
        want = int(round(share * total))
        if len(rows) == 0 or want == 0:
            continue
        rng = np.random.default_rng([seed, epoch, i])
        copies, rest = divmod(want, len(rows))
        out += [rows] * copies + [rng.permutation(rows)[:rest]]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)
