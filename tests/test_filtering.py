"""`mtx prepare`'s cleaning as a user meets it (mtx/data/filtering.py): each rule's drops
counted in the manifest and the printed table, every dropped pair written once with its
reason and line, the same result for any number of workers, and the dual cross-entropy
filter (mtx/jobs/dual.py)."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
from conftest import BOTH_WAYS, ROOT, run_config
from helpers.common import invoke, mtx, write_pair
from hypothesis import given, settings
from hypothesis import strategies as st

from mtx.config import CleanConfig, load_config
from mtx.data.clean import PAIR_RULES, Duplicates, Rule, Rules, pair_key
from mtx.data.filtering import Dropped, dual_filter, order, sift, table, take
from mtx.data.prepare import prepare
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.jobs.dual import DualCrossEntropy
from mtx.train.trainer import train

TOY = ROOT / "configs" / "toy.yaml"
CLEAN = [
    (
        "A man rides a red bike down the street.",
        "Ein Mann fährt mit einem roten Fahrrad die Straße hinunter.",
    ),  # fmt: skip
    ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A woman is reading a book in the park.", "Eine Frau liest ein Buch im Park."),
    ("Children are swimming in a lake.", "Kinder schwimmen in einem See."),
]
# one pair made for each rule, in the order the rules are met
NOISE = [
    ("", "Ein leerer Satz.", "empty"),
    ("A dog runs \ufffd fast.", "Ein Hund rennt schnell.", "nontext"),
    ("Stone &amp; tile.", "Stein und Fliesen.", "markup"),
    ("12:30 - 14:45 (90%)", "12:30 - 14:45 (90%)", "nonletters"),
    ("A cat sleeps on the warm sofa.", "A cat sleeps on the warm sofa!", "copy"),
    ("Three cats on 4 chairs.", "Drei Katzen auf 5 Stühlen.", "numbers"),
    ("A cat sleeps on a sofa.", "Un chat dort sur un canapé rouge.", "langid"),
    ("two dogs play in the snow", "Zwei Hunde spielen im Schnee!", "duplicate"),  # of CLEAN[1]
]


def corpus(tmp_path, repeats: int = 1):
    """CLEAN and NOISE, shuffled with a fixed seed, `repeats` times (other words each time
    so that only the intended duplicates repeat): (prefix, the pairs)."""
    pairs = []
    for r in range(repeats):
        tail = f" {'Hallo' if r % 2 else 'Welt'} {r}" if repeats > 1 else ""
        tail_en = f" {'Hello' if r % 2 else 'World'} {r}" if repeats > 1 else ""
        pairs += [(s + tail_en, t + tail, "") for s, t in CLEAN]
        pairs += [(s, t, why) if r == 0 else (s + tail_en, t + tail, why) for s, t, why in NOISE]
    order = np.random.default_rng(0).permutation(len(pairs))
    pairs = [pairs[i] for i in order]
    # each duplicate after the pair it repeats (the first met is kept)
    for i, pair in enumerate(pairs):
        if pair[2] == "duplicate":
            first = next(
                j for j, p in enumerate(pairs) if p[1].startswith(CLEAN[1][1]) and not p[2]
            )
            if first > i:
                pairs[i], pairs[first] = pairs[first], pairs[i]
    write_pair(tmp_path / "train", [p[0] for p in pairs], [p[1] for p in pairs])
    write_pair(tmp_path / "valid", [s for s, _ in CLEAN], [t for _, t in CLEAN])
    return tmp_path / "train", pairs


def config(tmp_path, run: str, prefix, *extra):
    return load_config(None, [f"run_dir={tmp_path / run}", f"data.train={prefix}",
                              f"data.valid={tmp_path / 'valid'}", "data.test=",
                              "data.vocab_size=80", *extra])  # fmt: skip


def dropped_rows(run) -> list[list[str]]:
    lines = (run / "prepared" / "dropped.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "split\tset\tline\treason\tsource\ttarget"
    return [line.split("\t") for line in lines[1:]]


def test_each_rule_drops_its_pair_and_every_drop_is_accounted_for(tmp_path):
    prefix, pairs = corpus(tmp_path)
    logged = []
    prepare(config(tmp_path, "run", prefix), log=logged.append)
    manifest = json.loads((tmp_path / "run/prepared/manifest.json").read_text())
    train = manifest["splits"]["train"]
    assert train["dropped"] == {why: 1 for _, _, why in NOISE}
    assert train["kept"] == len(CLEAN)
    # dropped.tsv: each dropped pair once, with its reason and its line in the source files
    rows = dropped_rows(tmp_path / "run")
    assert sorted(r[3] for r in rows) == sorted(why for _, _, why in NOISE)
    for split, name, line, reason, src, tgt in rows:
        assert split == "train" and name == "en-de"
        original = pairs[int(line) - 1]
        assert original[2] == reason
        assert (src, tgt) == (" ".join(original[0].split()), " ".join(original[1].split()))
    # the printed table: one row a rule that dropped something, in the rules' order
    start = logged.index("pairs dropped, by rule (every one in dropped.tsv):")
    rows = [line.split() for line in logged[start + 1 : start + 12]]
    assert rows[0] == ["train", "valid"]
    assert [r[0] for r in rows[1:11]] == ["read", *(why for _, _, why in NOISE), "kept"]
    assert rows[1] == ["read", str(len(pairs)), str(len(CLEAN))]


def test_a_rule_registered_in_the_table_drops_counts_and_is_ordered(tmp_path):
    """A made-up rule, added to clean.py's PAIR_RULES alone (its setting declared nowhere
    else: at its default), drops its pair in prepare, counted in the manifest, dropped.tsv
    and the printed table, in its place among the rules."""
    shouting = Rule("shouting", "shouting", True, False,
                    lambda on, s, t, n: t.isupper(), "a target in capitals")  # fmt: skip
    before_copy = next(i for i, r in enumerate(PAIR_RULES) if r.name == "copy")
    PAIR_RULES.insert(before_copy, shouting)  # registered: the table is the one place
    try:
        prepared_with_a_shouting_pair(tmp_path)
    finally:
        PAIR_RULES.remove(shouting)
    assert "shouting" not in order()


def prepared_with_a_shouting_pair(tmp_path):
    prefix, pairs = corpus(tmp_path)
    src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
    src.insert(2, "Two cats sleep.")
    tgt.insert(2, "ZWEI KATZEN SCHLAFEN.")
    write_pair(prefix, src, tgt)
    logged = []
    prepare(config(tmp_path, "run", prefix), log=logged.append)
    manifest = json.loads((tmp_path / "run/prepared/manifest.json").read_text())
    assert manifest["splits"]["train"]["dropped"]["shouting"] == 1
    assert ["train", "en-de", "3", "shouting"] in [r[:4] for r in dropped_rows(tmp_path / "run")]
    start = logged.index("pairs dropped, by rule (every one in dropped.tsv):")
    labels = [line.split()[0] for line in logged[start + 2 : start + 13]]
    assert labels.index("nonletters") < labels.index("shouting") < labels.index("copy")
    assert Rules.off().replace(shouting=True).reason("Hi.", "HALLO.") == "shouting"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["", "", "", "empty", "langid"])),
                max_size=60))  # fmt: skip
def test_sift_drops_what_the_rules_and_first_seen_keys_drop_in_order(tmp_path_factory, rows):
    """The kept rows, the counts (in the order reasons are first met) and dropped.tsv are the
    pair-by-pair pass's: a pair with a reason goes for it; of the others, a pair whose key an
    earlier one of them had goes as a duplicate."""
    tmp = tmp_path_factory.mktemp("sift")
    src = [f"s{v}" for v, _ in rows]
    keys = [pair_key(x, "t") for x in src]
    marked = datasets.Dataset.from_dict({
        "src": src, "tgt": ["t"] * len(rows), "reason": [r for _, r in rows],
        "line": list(range(1, len(rows) + 1)), "key": keys,
    })  # fmt: skip
    want_kept, want_counts, want_lines, seen = [], {"read": len(rows)}, [], Duplicates()
    for i, (s, (_, reason), key) in enumerate(zip(src, rows, keys)):
        if not reason and seen.seen_before(key):
            reason = "duplicate"
        if reason:
            want_counts[reason] = want_counts.get(reason, 0) + 1
            want_lines.append(f"train\tx\t{i + 1}\t{reason}\t{s}\tt")
        else:
            want_kept.append(i)
    dropped = Dropped(tmp / "dropped.tsv")
    kept, counts = sift(marked, "train\tx", dropped)
    dropped.close()
    assert kept.tolist() == want_kept and list(counts.items()) == list(want_counts.items())
    assert (tmp / "dropped.tsv").read_text().splitlines()[1:] == want_lines


def test_each_built_in_rule_s_setting_is_declared_with_its_default():
    clean_config = CleanConfig()
    for rule in PAIR_RULES:
        assert getattr(clean_config, rule.setting) == rule.default, rule.name
        assert rule.name in order()
    assert Rules.of(clean_config, "en", "de") == Rules("en", "de")


def test_every_rule_can_be_turned_off(tmp_path):
    prefix, pairs = corpus(tmp_path)
    off = ["data.dedup=false", "data.clean.langid=0", "data.clean.copy=0",
           "data.clean.numbers=false", "data.clean.nontext=false", "data.clean.markup=false",
           "data.clean.max_nonletters=1", "data.clean.lexical=0"]  # fmt: skip
    prepare(config(tmp_path, "run", prefix, *off), log=lambda *_: None)
    manifest = json.loads((tmp_path / "run/prepared/manifest.json").read_text())
    assert manifest["splits"]["train"]["dropped"] == {"empty": 1}
    assert [r[3] for r in dropped_rows(tmp_path / "run")] == ["empty"]


def test_the_same_data_and_drops_for_one_and_two_workers(tmp_path):
    prefix, _ = corpus(tmp_path, repeats=40)
    for workers in (1, 2):
        cfg = config(tmp_path, f"run{workers}", prefix, f"data.workers={workers}")
        prepare(cfg, log=lambda *_: None)
    one, two = (json.loads((tmp_path / f"run{w}/prepared/manifest.json").read_text())
                for w in (1, 2))  # fmt: skip
    assert one["splits"] == two["splits"]
    dropped = one["splits"]["train"]["dropped"]
    assert set(dropped) >= {"duplicate", "nontext", "markup", "copy", "numbers", "langid"}
    rows = dropped_rows(tmp_path / "run1")
    assert rows == dropped_rows(tmp_path / "run2")
    assert len(rows) == sum(dropped.values()) and len({r[2] for r in rows}) == len(rows)


class FakeScores:
    """A dual scorer whose score is given by the pair's source: "0.7 ..." scores 0.7."""

    def __call__(self, sources, targets, src_lang, tgt_lang):
        assert (src_lang, tgt_lang) == ("en", "de")
        return [float(s.split()[0]) for s in sources]


@pytest.mark.parametrize(
    "setting, kept",
    [("data.clean.dual_threshold=0.5", ["0.1", "0.3", "0.5"]),
     ("data.clean.dual_keep=0.4", ["0.1", "0.3"]),  # of 5: 2, the best
     ("data.clean.dual_keep=1", ["0.1", "0.3", "0.5", "0.9", "2.0"])],
)  # fmt: skip
def test_the_dual_filter_keeps_below_a_threshold_or_the_best_share(tmp_path, setting, kept):
    import datasets

    scores = ["0.9", "0.1", "2.0", "0.5", "0.3"]
    text = datasets.Dataset.from_dict({"src": [f"{s} x" for s in scores],
                                       "tgt": ["y"] * 5, "line": [1, 2, 3, 4, 5]})  # fmt: skip
    cfg = load_config(None, [setting])
    dropped = Dropped(tmp_path / "dropped.tsv")
    out, counts = dual_filter(text, cfg.data, ("en", "de"), FakeScores(), "train\tx", dropped,
                              tmp_path, log=lambda *_: None)  # fmt: skip
    dropped.close()
    assert sorted(s.split()[0] for s in out["src"]) == kept
    assert counts == {"dual": 5 - len(kept)}
    rows = (tmp_path / "dropped.tsv").read_text().splitlines()[1:]
    assert sorted(r.split("\t")[4].split()[0] for r in rows) == sorted(set(scores) - set(kept))


@pytest.fixture(scope="module")
def both_ways(prepared_both_ways, tmp_path_factory):
    """A tiny model of both directions of the toy corpus, trained for 30 updates."""
    run = tmp_path_factory.mktemp("both")
    train(run_config(run, prepared_both_ways, BOTH_WAYS, "train.max_steps=30"), log=lambda *_: None)
    return run / "checkpoints" / "last.pt"


def test_the_dual_score_is_junczys_dowmunts_formula(both_ways):
    sources = ["the dog sleeps.", "the child sees the beautiful bread.", "x"]
    targets = ["der hund schläft.", "das kind sieht das schöne brot.", "das kind"]
    tr = Translator.from_checkpoints(both_ways, device="cpu")
    forward = Scorer(tr.parts, "de").cross_entropies(sources, targets)
    backward = Scorer(tr.parts, "en").cross_entropies(targets, sources)
    for f, b, pair in zip(forward, backward, zip(sources, targets)):
        fwd = Scorer(tr.parts, "de").score([pair[0]], [pair[1]])[0]
        assert f == pytest.approx(-fwd.total / fwd.tokens)
        assert b > 0 and f > 0
    got = DualCrossEntropy(load_config(None, [f"data.clean.dual_forward={both_ways}"]).data.clean)
    scores = got(sources, targets, "en", "de")
    assert scores == pytest.approx([abs(f - b) + (f + b) / 2 for f, b in zip(forward, backward)])


def test_mtx_prepare_filters_by_dual_cross_entropy(both_ways, tmp_path):
    prefix, _ = corpus(tmp_path, repeats=5)
    sets = [f"run_dir={tmp_path / 'run'}", f"data.train={prefix}", f"data.valid={tmp_path / 'valid'}",
            "data.test=", "data.vocab_size=80", f"data.clean.dual_forward={both_ways}",
            "data.clean.dual_keep=0.5"]  # fmt: skip
    result = mtx("prepare", "--config", TOY, *(x for s in sets for x in ("--set", s)))
    assert "dual cross-entropy kept" in result.output
    manifest = json.loads((tmp_path / "run/prepared/manifest.json").read_text())
    train = manifest["splits"]["train"]
    read, after_rules = train["read"], ("dual", "too_long", "ratio")  # the filter's input
    scored = read - sum(v for k, v in train["dropped"].items() if k not in after_rules)
    assert f"dual cross-entropy kept {round(scored * 0.5)} of {scored} pairs" in result.output
    assert train["dropped"]["dual"] == scored - round(scored * 0.5)
    assert sum(r[3] == "dual" for r in dropped_rows(tmp_path / "run")) == train["dropped"]["dual"]


def test_a_dual_model_that_cannot_score_the_direction_is_refused(prepared, tmp_path):
    prefix, _ = corpus(tmp_path)
    train(run_config(tmp_path / "one", prepared, "train.max_steps=2"), log=lambda *_: None)
    one_way = tmp_path / "one" / "checkpoints" / "last.pt"  # en->de only
    sets = [f"run_dir={tmp_path / 'run'}", f"data.train={prefix}", f"data.valid={tmp_path / 'valid'}",
            "data.test=", f"data.clean.dual_forward={one_way}"]  # fmt: skip

    result = invoke("prepare", "--config", TOY, *(x for s in sets for x in ("--set", s)))
    assert result.exit_code != 0
    assert (
        "data.clean.dual_backward" in result.output
        and "translates into de, not en" in result.output
    )
    assert not (tmp_path / "run" / "prepared").exists()
    missing = invoke(
        "prepare", "--config", TOY, "--set", f"data.clean.dual_forward={tmp_path / 'no.pt'}"
    )
    assert (
        missing.exit_code != 0 and "data.clean.dual_forward: no such checkpoint" in missing.output
    )


def test_the_table_lists_the_rules_in_order():
    from collections import Counter

    lines = table({"train": Counter(read=10, copy=2, empty=1, zzz=1), "valid": Counter(read=3)},
                  {"train": 6, "valid": 3})  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["read", "empty", "copy", "zzz", "kept"]


def test_take_writes_the_rows_asked_for_in_order_to_its_own_file(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"src": [f"s{i}" for i in range(10)], "line": list(range(10))})
    ds = ds.map(lambda b: b, batched=True, writer_batch_size=3)  # a map's output, as prepare's
    assert len(ds.data.table.to_batches()) > 2  # rows from several record batches
    rows = np.array([0, 2, 2, 4, 5, 6, 9])
    out = take(ds, rows, tmp_path / "t.arrow")
    assert out.to_dict() == ds.select(rows).to_dict()
    assert out.features == ds.features and (tmp_path / "t.arrow").is_file()
    with pytest.raises(ValueError, match="ascending"):
        take(ds, np.array([3, 1]), tmp_path / "v.arrow")
    with pytest.raises(ValueError, match="indices mapping"):
        take(ds.select([2, 1]), np.array([0]), tmp_path / "u.arrow")  # its rows are not its table's
