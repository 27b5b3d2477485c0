"""The lexical rule (mtx/data/lexical.py, data.clean.lexical): words as it sees them, the
translations it learns from a corpus, the scores that separate aligned pairs from misaligned
ones, and the rule in `mtx prepare` with its drops accounted for."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
from helpers.common import write_pair

from mtx.config import load_config
from mtx.data import lexical
from mtx.data.prepare import prepare

CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
WORDS = 2000


def made_up_words(n: int, rng: random.Random, taken: set[str]) -> list[str]:
    """`n` distinct pronounceable words of three syllables, none in `taken`."""
    out = []
    while len(out) < n:
        word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(3))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def corpus(pairs: int, misaligned: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """A made-up language pair with a one-to-one lexicon of WORDS words drawn by Zipf's law,
    every sentence holding the commonest word; `pairs` aligned pairs (the target's words the
    source's translations, shuffled), then `misaligned` pairs whose target is another aligned
    pair's, their rows marked in the third result."""
    rng, taken = random.Random(seed), set()
    src_words, tgt_words = made_up_words(WORDS, rng, taken), made_up_words(WORDS, rng, taken)
    weights = [1 / (i + 1) for i in range(WORDS)]
    src, tgt = [], []
    for _ in range(pairs):
        ids = {0, *rng.choices(range(WORDS), weights, k=rng.randint(4, 9))}
        order = sorted(ids, key=lambda _: rng.random())
        src.append(" ".join(src_words[i] for i in order).capitalize() + ".")
        shuffled = sorted(ids, key=lambda _: rng.random())
        tgt.append(" ".join(tgt_words[i] for i in shuffled).capitalize() + "!")
    bad = np.zeros(pairs + misaligned, dtype=bool)
    for _ in range(misaligned):
        src.append(src[rng.randrange(pairs)])
        tgt.append(tgt[rng.randrange(pairs)])
    bad[pairs:] = True
    return src, tgt, bad


def test_words_are_lowercased_runs_of_letters_marks_and_digits_once_a_sentence():
    texts = pa.array(["Über den Fluß, über—die 3 Brücken!", "", "'' --", "naïve cafe\u0301 x2"])
    vocab = lexical.vocabulary(texts)
    assert vocab.to_pylist() == ["über", "den", "fluß", "die", "3", "brücken", "naïve",
                                 "cafe\u0301", "x2"]  # fmt: skip
    got = lexical.words(texts, vocab)
    assert got.rows.tolist() == [0] * 6 + [3] * 3  # "über" once; rows 1, 2 have none
    assert [vocab[i].as_py() for i in got.ids[:5]] == ["über", "den", "fluß", "die", "3"]
    # words not in the vocabulary are left out
    known = lexical.words(pa.array(["den Fluß und die Brücke"]), vocab)
    assert sorted(vocab[i].as_py() for i in known.ids) == ["den", "die", "fluß"]


def test_the_table_learns_the_lexicon_and_the_scores_separate_misaligned_pairs():
    src, tgt, bad = corpus(3000, 300)
    table = lexical.Table.learn(pa.array(src), pa.array(tgt))
    starts, translations = table.forward
    src_vocab, tgt_vocab = table.src_vocab.to_pylist(), table.tgt_vocab.to_pylist()
    # each source word's best translation is its lexicon entry (the same position in the
    # made-up word lists: the n-th word met on each side is not the n-th entry, so match by
    # the aligned pairs' word sets)
    first_pair = (src[0].lower().strip(".").split(), tgt[0].lower().strip("!").split())
    for word in first_pair[0]:
        i = src_vocab.index(word)
        best = tgt_vocab[translations[starts[i]]]
        assert best in first_pair[1]
    assert all(starts[i + 1] - starts[i] <= lexical.TOP for i in range(len(src_vocab)))
    scores = table.scores(pa.array(src), pa.array(tgt))
    assert scores.dtype == np.float64 and scores.shape == (len(src),)
    assert scores[~bad].min() > 0.9  # aligned: (nearly) every word finds its translation
    # misaligned: what they share are mostly common words, which count for little
    assert np.median(scores[bad]) < 0.25 and np.quantile(scores[bad], 0.9) < 0.5
    # a pair's score does not depend on the pairs scored beside it
    alone = table.scores(pa.array(src[-5:]), pa.array(tgt[-5:]))
    assert np.array_equal(alone, scores[-5:])


def test_cooccurrences_counted_by_blocks_are_np_uniques(monkeypatch):
    """The co-occurring word pairs and their counts, counted a block of pairs at a time and
    merged, are exactly np.unique's over every co-occurrence at once (blocks of 7 pairs,
    some pairs with no known words)."""
    rng = random.Random(5)
    lexicon = [f"w{i}" for i in range(40)]
    src = [" ".join(rng.choices(lexicon, k=rng.randint(0, 9))) for _ in range(101)]
    tgt = [" ".join(rng.choices(lexicon, k=rng.randint(0, 9))) for _ in range(101)]
    s_text, t_text = pa.array(src), pa.array(tgt)
    s = lexical.words(s_text, lexical.vocabulary(s_text))
    t = lexical.words(t_text, lexical.vocabulary(t_text))
    vt = len(lexical.vocabulary(t_text))
    whole = np.unique(lexical._cooccurring(s, t, 101, vt), return_counts=True)
    monkeypatch.setattr(lexical, "COUNT_BLOCK", 7)
    keys, counts = lexical.cooccurrences(s, t, 101, vt)
    assert np.array_equal(keys, whole[0]) and np.array_equal(counts, whole[1])
    assert counts.sum() == len(lexical._cooccurring(s, t, 101, vt)) and counts.max() > 1


def test_common_words_count_for_little():
    src, tgt, _ = corpus(3000, 0)
    table = lexical.Table.learn(pa.array(src), pa.array(tgt))
    # a target holding only the translation of the word every sentence holds
    common_src = src[0].lower().strip(".").split()
    common = [w for w in common_src if all(w in s.lower() for s in src[:50])]
    assert len(common) == 1
    i = table.src_vocab.to_pylist().index(common[0])
    starts, translations = table.forward
    common_tgt = table.tgt_vocab[translations[starts[i]]].as_py()
    # (it is also a lesser translation of the commoner words, which it meets in many pairs)
    assert table.scores(pa.array([src[0]]), pa.array([common_tgt]))[0] < 0.1
    assert table.scores(pa.array([src[0]]), pa.array([tgt[0]]))[0] == 1
    assert table.src_weight[i] == 0  # log(pairs / pairs)


def test_the_sample_is_every_row_or_a_seeded_draw_in_order():
    assert lexical.sample_rows(5).tolist() == [0, 1, 2, 3, 4]
    rows = lexical.sample_rows(lexical.SAMPLE * 3)
    assert len(rows) == lexical.SAMPLE and np.all(np.diff(rows) > 0)
    assert np.array_equal(rows, lexical.sample_rows(lexical.SAMPLE * 3))


def config(tmp_path, run: str, prefix, *extra):
    src, tgt, _ = corpus(50, 0, seed=1)
    write_pair(tmp_path / "valid", src, tgt)
    return load_config(None, [f"run_dir={tmp_path / run}", f"data.train={prefix}",
                              f"data.valid={tmp_path / 'valid'}", "data.test=",
                              "data.vocab_size=300",
                              "data.clean.langid=0", *extra])  # fmt: skip


def test_mtx_prepare_drops_misaligned_pairs_and_accounts_for_each(tmp_path):
    src, tgt, bad = corpus(lexical.MIN_PAIRS, 500)
    write_pair(tmp_path / "train", src, tgt)
    logged: list[str] = []
    for workers in (1, 2):
        cfg = config(
            tmp_path,
            f"run{workers}",
            tmp_path / "train",
            f"data.workers={workers}",
            "data.clean.lexical=0.5",
        )
        prepare(cfg, log=logged.append)
    assert any("lexical rule: " in line and "translations learnt from" in line for line in logged)
    one, two = (json.loads((tmp_path / f"run{w}/prepared/manifest.json").read_text())
                for w in (1, 2))  # fmt: skip
    assert one["splits"] == two["splits"]
    dropped = one["splits"]["train"]["dropped"]
    rows = [r.split("\t") for r in
            (tmp_path / "run1/prepared/dropped.tsv").read_text().splitlines()[1:]]  # fmt: skip
    lexical_lines = [int(r[2]) for r in rows if r[3] == "lexical"]
    assert len(lexical_lines) == dropped["lexical"] == len(set(lexical_lines))
    caught = bad[np.array(lexical_lines) - 1]
    assert caught.all() and caught.sum() > 0.9 * bad.sum()  # no aligned pair, most others
    assert (tmp_path / "run2/prepared/dropped.tsv").read_text() == (
        tmp_path / "run1/prepared/dropped.tsv").read_text()  # fmt: skip


def test_a_small_part_is_not_filtered_and_the_rule_turns_off(tmp_path):
    src, tgt, _ = corpus(300, 100)
    write_pair(tmp_path / "train", src, tgt)
    logged: list[str] = []
    prepare(config(tmp_path, "small", tmp_path / "train"), log=logged.append)
    assert any("too few to learn translations from" in line for line in logged)
    manifest = json.loads((tmp_path / "small/prepared/manifest.json").read_text())
    assert "lexical" not in manifest["splits"]["train"]["dropped"]
    src, tgt, _ = corpus(lexical.MIN_PAIRS, 100)
    write_pair(tmp_path / "big", src, tgt)
    logged.clear()
    prepare(config(tmp_path, "off", tmp_path / "big", "data.clean.lexical=0"), log=logged.append)
    assert not any("lexical" in line for line in logged)
    manifest = json.loads((tmp_path / "off/prepared/manifest.json").read_text())
    assert "lexical" not in manifest["splits"]["train"]["dropped"]
