import hashlib
import json
import pickle
import re
import socket

import datasets
import pyarrow as pa
import pytest
import torch
from helpers.common import write_pair
from hypothesis import given as for_all
from hypothesis import settings
from hypothesis import strategies as st

from mtx.checkpoint import Checkpoint
from mtx.config import Config, load_config
from mtx.data import sources, toy, vocab
from mtx.data.prepare import prepare
from mtx.data.prepared import load_prepared
from mtx.errors import MtxError
from mtx.tokens import EOS_ID


def test_local_files_load_line_aligned_with_crlf_and_unicode_separators(tmp_path):
    write_pair(tmp_path / "c", ["a b", "x\u2028y", ""], ["A B", "X Y", "Z"], newline="\r\n")
    ds = sources.load_split(str(tmp_path / "c"), "en", "de", "train", tmp_path / "cache")
    assert ds["src"] == ["a b", "x\u2028y", ""]
    assert ds["tgt"] == ["A B", "X Y", "Z"]


def _lines_one_by_one(path):
    """read_lines' definition: split on b"\n" only, one "\r" before it dropped, UTF-8."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\n").removesuffix("\r")
            except UnicodeDecodeError:
                raise MtxError(f"{path}:{number}: invalid UTF-8") from None


_PIECES = ["a", "Straße", "\r", "\r\n", "\n", "\u2028", "\x85", "\x0c", " ", "\u00e9", "\U0001f600"]


@settings(max_examples=150, deadline=None)
@for_all(
    st.lists(st.sampled_from(_PIECES), max_size=40).map("".join),
    st.sampled_from([b"", b"\xff", b"\xc3"]),
    st.integers(1, 4),
)
def test_line_blocks_read_each_line_as_one_by_one(tmp_path_factory, text, bad, size):
    """Blocks of `size` lines decoded at once give the lines (and the failing line's number)
    that decoding one line at a time gives, whatever the line endings and block edges."""
    path = tmp_path_factory.mktemp("blocks") / "f.txt"
    raw = text.encode("utf-8")
    cut = len(raw) // 2
    while cut and (raw[cut] & 0xC0) == 0x80:  # a character boundary
        cut -= 1
    path.write_bytes(raw[:cut] + bad + raw[cut:])
    try:
        expected = list(_lines_one_by_one(path))
    except MtxError as e:
        with pytest.raises(MtxError, match=re.escape(str(e))):
            list(sources.line_blocks(path, size))
        return
    blocks = list(sources.line_blocks(path, size))
    assert [line for block in blocks for line in block] == expected
    assert all(len(block) == size for block in blocks[:-1])


def test_local_file_errors_name_the_file(tmp_path):
    with pytest.raises(MtxError, match=r"missing\.en"):
        sources.load_split(str(tmp_path / "missing"), "en", "de", "train", tmp_path)
    write_pair(tmp_path / "c", ["a", "b"], ["A"])
    with pytest.raises(MtxError, match=r"c\.en has 2 lines but .*c\.de has 1"):
        sources.load_split(str(tmp_path / "c"), "en", "de", "train", tmp_path)
    (tmp_path / "u.en").write_bytes(b"ok\nbad \xff byte\n")
    (tmp_path / "u.de").write_bytes(b"ok\nfine\n")
    with pytest.raises(MtxError, match=r"u\.en:2: invalid UTF-8"):
        sources.load_split(str(tmp_path / "u"), "en", "de", "train", tmp_path / "cache")


@pytest.fixture
def hub(monkeypatch):
    """A hub endpoint that answers connections: a socket listening on 127.0.0.1."""
    server = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    yield
    server.close()


def test_hub_spec_is_parsed_and_translation_column_mapped(monkeypatch, tmp_path, hub):
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict(
            {"translation": [{"de": "Hallo Welt", "en": "hello world"}, {"de": "Ja", "en": "yes"}]}
        )

    monkeypatch.setattr(sources.datasets, "load_dataset", fake_load_dataset)
    ds = sources.load_split("hf:wmt/wmt14:de-en", "en", "de", "validation", tmp_path)
    assert calls == [("wmt/wmt14", "de-en", "validation")]
    assert ds["src"] == ["hello world", "yes"] and ds["tgt"] == ["Hallo Welt", "Ja"]
    sources.load_split("hf:wmt/wmt14:de-en:test", "en", "de", "validation", tmp_path)
    assert calls[-1] == ("wmt/wmt14", "de-en", "test")


def test_hub_dataset_with_language_columns(monkeypatch, tmp_path, hub):
    monkeypatch.setattr(
        sources.datasets,
        "load_dataset",
        lambda name, config, split: datasets.Dataset.from_dict({"en": ["a"], "de": ["b"]}),
    )
    ds = sources.load_split("hf:someone/corpus", "en", "de", "train", tmp_path)
    assert (ds["src"], ds["tgt"]) == (["a"], ["b"])


def test_hub_while_offline_says_it_is_a_network_problem(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(sources.datasets, "load_dataset", offline)
    with pytest.raises(MtxError, match="network.*local files"):
        sources.load_split("hf:wmt/wmt14:de-en", "en", "de", "train", tmp_path)


def test_toy_corpus_is_deterministic_disjoint_and_needs_reordering():
    a, b = toy.generate(1), toy.generate(1)
    assert a == b
    assert {k: len(v) for k, v in a.items()} == toy.SPLIT_SIZES
    train = {en for en, _ in a["train"]}
    assert not train & {en for en, _ in a["test"]}
    assert not train & {en for en, _ in a["valid"]}
    verbs = {de for _, _, de in toy.TRANSITIVE + toy.INTRANSITIVE + toy.DITRANSITIVE}
    # verb-final subordinate clauses: a "weil" clause closes the sentence with its verb
    because = [de for en, de in a["train"] if " because " in en]
    assert because and all(", weil " in de and de[:-1].split()[-1] in verbs for de in because)
    # verb second: a fronted adverb is followed by the verb, then the subject
    adverbs = {de for _, de in toy.ADVERBS}
    fronted = [de.split() for _, de in a["train"] if de.split()[0] in adverbs]
    assert fronted and all(words[1] in verbs for words in fronted)


def test_prepare_cleans_reports_and_encodes(tmp_path):
    src = ["the dog sleeps ."] * 3 + ["  a  cat   sees a dog .  ", "", "x " * 300, "one two"]
    tgt = ["der hund schläft ."] * 3 + ["eine katze sieht einen hund .", "leer", "y", "eins zwei"]
    write_pair(tmp_path / "train", src, tgt)
    write_pair(tmp_path / "valid", src[:2], tgt[:2])
    write_pair(tmp_path / "test", src[3:5], tgt[3:5])
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            f"data.train={tmp_path / 'train'}",
            f"data.valid={tmp_path / 'valid'}",
            f"data.test={tmp_path / 'test'}",
            "data.vocab_size=60",
            "data.max_len=50",
            "data.dedup=true",
            "train.max_tokens=100",
        ],
    )
    logged = []
    out = prepare(cfg, log=logged.append)
    manifest = json.loads((out / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    assert train["read"] == 7
    assert train["dropped"] == {"duplicate": 2, "empty": 1, "too_long": 1}
    assert train["kept"] == 3
    assert manifest["splits"]["test"]["kept"] == 2  # test pairs are never dropped
    # What the data was: hashes of the source files, of the kept pairs, of the vocabulary.
    assert train["files"] == {
        str(tmp_path / f"train.{lang}"): hashlib.sha256(
            (tmp_path / f"train.{lang}").read_bytes()
        ).hexdigest()
        for lang in ("en", "de")
    }
    kept = (
        "the dog sleeps .\tder hund schläft .\na cat sees a dog .\teine katze sieht einen hund .\n"
    )
    kept += "one two\teins zwei\n"
    assert train["pairs_sha256"] == hashlib.sha256(kept.encode()).hexdigest()
    assert manifest["spm_sha256"] == hashlib.sha256((out / "spm.model").read_bytes()).hexdigest()
    vocab_lines = (out / "spm.vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab_lines) == manifest["vocab_size"]
    assert vocab_lines[3].split("\t")[:2] == ["3", "</s>"]
    ds = load_prepared(cfg, "train")
    assert ds[1]["src"] == "a cat sees a dog ."  # whitespace stripped and collapsed
    for row in ds:
        assert row["src_ids"][-1] == EOS_ID and row["tgt_ids"][-1] == EOS_ID
        assert row["src_len"] == len(row["src_ids"])
    assert not (tmp_path / "run" / "prepared.tmp").exists()
    # the time of each stage, in one line
    stages = ("read", "clean", "dedup", "sentencepiece", "encode", "write")
    line = next(x for x in logged if x.startswith("seconds: "))
    assert re.fullmatch("seconds: " + ", ".join(rf"{s} \d+\.\d" for s in stages), line)


def test_sentencepiece_reads_only_the_sentences_it_trains_on():
    """Up to data.spm_sample sentences, every pair's two sides in order; beyond it, both
    sides of spm_sample / 2 pairs drawn at random, the same ones every time."""
    from mtx.data.prepare import _training_sentences

    n = 100
    ds = datasets.Dataset.from_dict(
        {"src": [f"s{i}" for i in range(n)], "tgt": [f"t{i}" for i in range(n)], "line": [0] * n}
    )
    every = [f"s{i}" for i in range(n)] + [f"t{i}" for i in range(n)]
    assert list(_training_sentences(ds, 0)) == every
    assert list(_training_sentences(ds, 2 * n)) == every
    drawn = list(_training_sentences(ds, 50))
    assert len(drawn) == 50 and drawn == list(_training_sentences(ds, 50))
    src = [int(x[1:]) for x in drawn if x[0] == "s"]
    assert src == sorted(src) and src == [int(x[1:]) for x in drawn if x[0] == "t"]
    assert len(set(src)) == 25 and src != list(range(25))


def trained_on_sentences(sentences, vocab_size, sample, coverage, reserved) -> bytes:
    """SentencePiece trained on the sentences themselves, as train_bpe did before it counted
    words: the reference for the word counts."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=coverage,
        input_sentence_size=sample, shuffle_input_sentence=True, pad_id=0, unk_id=1, bos_id=2,
        eos_id=3, max_sentence_length=vocab.MAX_SENTENCE_BYTES, user_defined_symbols=reserved,
        num_threads=2, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


TRICKY = ["a", "b", "é", "e\u0301", " ", "  ", "\t", "\u00a0", "\u3000", "\u200b", "\x1c", "\x0b",
          "\r", "\u2028", "\u0085", "\ufeff", "\u2047", " \u2047 ", "\u2585", "x\u2585", "ﬁ", "Ⅻ", "語", "٣", "-", "."]  # fmt: skip


@settings(max_examples=25, deadline=None)
@for_all(
    st.lists(st.lists(st.sampled_from(TRICKY), min_size=0, max_size=12).map("".join),
             min_size=1, max_size=40),
    st.sampled_from([0.9995, 1.0]),
)  # fmt: skip
def test_sentencepiece_learns_from_word_counts_the_model_the_sentences_give(sentences, coverage):
    """train_bpe gives SentencePiece each distinct word and its count: the model proto is the
    one SentencePiece trains on the sentences, byte for byte, on text with every kind of
    space, characters the normaliser drops or rewrites, combining marks, SentencePiece's
    own UNK surface and empty lines."""
    lines = sentences + ["a b a é b", "the cat sat", "ab ab ab ba"]  # enough to train on
    got = vocab.train_bpe(iter(lines), 40, 0, coverage, [">>de<<"])
    assert got == trained_on_sentences(lines, 40, 0, coverage, [">>de<<"])


def test_sentencepiece_from_word_counts_on_multi30k_and_the_toy_corpus():
    """The same model either way on real text: Multi30k's training pairs with data.spm_sample
    recorded, and the toy corpus with a small vocabulary."""
    from conftest import MULTI30K

    m30k = [line for side in ("en", "de") for line in
            (MULTI30K / f"train.{side}").read_text(encoding="utf-8").splitlines()]  # fmt: skip
    toys = [x for pair in toy.split_pairs("train") for x in pair]
    for lines, size, sample in ((m30k, 8000, 2_000_000), (toys, 400, 0)):
        got = vocab.train_bpe(iter(lines), size, sample, 1.0)
        assert got == trained_on_sentences(lines, size, sample, 1.0, [])


def test_prepare_of_an_empty_corpus_fails_cleanly(tmp_path):
    write_pair(tmp_path / "e", ["", " "], ["x", ""])
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            f"data.train={tmp_path / 'e'}",
            f"data.valid={tmp_path / 'e'}",
            f"data.test={tmp_path / 'e'}",
        ],
    )
    with pytest.raises(MtxError, match="no usable pairs"):
        prepare(cfg, log=lambda *_: None)
    assert not (tmp_path / "run" / "prepared").exists()
    assert not (tmp_path / "run" / "prepared.tmp").exists()


def toy_prepare(run, *extra):
    """The toy corpus prepared into `run` (pairs over 12 subwords dropped: the filter runs)."""
    cfg = load_config(None, [f"run_dir={run}", "data.vocab_size=200", "data.max_len=12", *extra])
    return prepare(cfg, log=lambda *_: None), cfg


@pytest.mark.slow  # encoding worker processes (test_filtering.py runs two workers in the default run)
def test_one_and_two_encoding_workers_prepare_the_same_data(tmp_path):
    one, cfg1 = toy_prepare(tmp_path / "one", "data.workers=1")
    two, cfg2 = toy_prepare(tmp_path / "two", "data.workers=2")
    manifest = (one / "manifest.json").read_text()
    assert manifest == (two / "manifest.json").read_text()
    assert json.loads(manifest)["splits"]["train"]["dropped"]["too_long"] > 100
    for split in ("train", "valid", "test"):
        a, b = load_prepared(cfg1, split), load_prepared(cfg2, split)
        assert a.to_dict() == b.to_dict(), split


def test_encoding_workers_each_load_the_model_from_its_file(tmp_path):
    from mtx.data.prepare import Encoder

    toy_prepare(tmp_path / "run")
    encoder = Encoder(tmp_path / "run" / "prepared" / "spm.model")
    batch = pa.table({"src": ["a"], "tgt": ["b"]})
    assert encoder(batch)["src_ids"][0].as_py()[-1] == EOS_ID  # loaded here
    assert pickle.loads(pickle.dumps(encoder)).words is None  # a worker gets the path only


def test_data_spm_model_encodes_with_a_given_model_or_a_checkpoint_s(tmp_path):
    first, cfg = toy_prepare(tmp_path / "first")
    model_file = first / "spm.model"
    ckpt = tmp_path / "model.pt"
    spm_model = model_file.read_bytes()
    Checkpoint(Config(), spm_model, vocab.load(spm_model).get_piece_size(), {}).save(ckpt)
    for name, given in (("file", model_file), ("ckpt", ckpt)):
        # another vocabulary size, which a reused model ignores
        out, cfg2 = toy_prepare(tmp_path / name, f"data.spm_model={given}", "data.vocab_size=90")
        assert (out / "spm.model").read_bytes() == model_file.read_bytes()
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["spm_source"] == {
            "path": str(given.resolve()),
            "kind": "sentencepiece" if name == "file" else "checkpoint",
            "file_sha256": hashlib.sha256(given.read_bytes()).hexdigest(),
        }
        assert load_prepared(cfg2, "train")["src_ids"] == load_prepared(cfg, "train")["src_ids"]


def test_a_bad_data_spm_model_is_refused_before_anything_is_written(tmp_path):
    import sentencepiece as spm

    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    foreign = tmp_path / "foreign"  # SentencePiece's default ids: unk 0, bos 1, eos 2
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([s for s, _ in toy.split_pairs("train")[:500]]),
        model_prefix=str(foreign),
        vocab_size=60, minloglevel=2,
    )  # fmt: skip
    cases = {
        tmp_path / "missing.model": "no such file",
        junk: "not a SentencePiece model file or an mtx checkpoint",
        other: "data.spm_model: .*other.pt: not an mtx checkpoint",
        tmp_path / "foreign.model": r"pad, unk, bos and eos ids are \(-1, 0, 1, 2\)",
    }
    for path, message in cases.items():
        with pytest.raises(MtxError, match=message):
            toy_prepare(tmp_path / "run", f"data.spm_model={path}")
        assert not (tmp_path / "run" / "prepared").exists()


@settings(max_examples=50, deadline=None)
@for_all(
    st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=30),
    st.integers(1, 7),
    st.data(),
)
def test_pairs_sha256_hashes_the_pairs_as_lines_in_any_batches_and_selection(pairs, size, data):
    from mtx.data.prepare import pairs_sha256

    ds = datasets.Dataset.from_dict(
        {"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs], "n": list(range(len(pairs)))}
    )
    rows = data.draw(st.lists(st.integers(0, max(len(pairs) - 1, 0)), max_size=len(pairs)))
    picked = ds.select(rows if pairs else [])  # an indices mapping, as the cleaning leaves
    lines = "".join(f"{pairs[i][0]}\t{pairs[i][1]}\n" for i in (rows if pairs else []))
    assert pairs_sha256(picked, batch_size=size) == hashlib.sha256(lines.encode()).hexdigest()
