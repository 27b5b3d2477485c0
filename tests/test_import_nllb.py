"""`mtx import` of an NLLB (M2M100) model, checked against transformers on a model built here in
NLLB's exact layout (tests/helpers/nllb.py): the tokenizer's ids, fairseq's positions, the
logits, greedy and beam search with the target language's code, and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import nllb, translating
from helpers.common import assert_same_parameters, invoke, mtx, records
from helpers.translating import outputs, texts
from test_import import (
    N,
    assert_exported_back,
    assert_first_loss_is_transformers,
    assert_logits_equal,
    assert_translations_equal,
    fine_tuning,
    lines,
    only_eos_at_the_limit,
    targets,
    translator,
)

from mtx.checkpoint import Checkpoint
from mtx.data import toy
from mtx.decode.score import Scorer
from mtx.model.positions import fairseq_table


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(the M2M100 directory, its import, transformers' model and tokenizer)."""
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    root = tmp_path_factory.mktemp("nllb")
    directory = nllb.build(root / "nllb", steps=100)
    path = root / "model.pt"
    mtx("import", directory, "--output", path, "--src-lang", "eng_Latn", "--tgt-lang", "deu_Latn")
    hf = M2M100ForConditionalGeneration.from_pretrained(directory).eval()
    tokenizer = NllbTokenizer.from_pretrained(directory, src_lang="eng_Latn", tgt_lang="deu_Latn")
    return directory, path, hf, tokenizer


def test_fairseqs_positions_are_m2m100s_to_the_bit():
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding as Positions,
    )

    theirs = Positions.get_embedding(66, 32, padding_idx=1)
    assert torch.equal(fairseq_table(64, 32), theirs[2:])  # the first token reads row 2


def test_the_tokenizer_gives_transformers_ids(model):
    """On every line but one of spaces alone, where transformers' converted tokenizer gives a
    lone "▁" and SentencePiece (NLLB's own, as fairseq trained it) nothing: mtx follows
    SentencePiece there, as for an empty line."""
    _, path, _, tokenizer = model
    tr = translator(path)
    origin = tr.parts.codec.vocab.origin
    for line in lines(1000):
        theirs = tokenizer(line).input_ids
        if line and not line.strip():
            assert tokenizer.convert_ids_to_tokens(theirs[1:-1]) == ["▁"]
            assert tr.parts.codec.encode(line) == tr.parts.codec.encode("")
            theirs = tokenizer("").input_ids
        assert [origin[i] for i in tr.parts.codec.encode(line)] == theirs, line
    code = [origin[i] for i in tr.parts.codec.start()]
    for line in targets(1000):
        ours = code + [origin[i] for i in tr.parts.codec.vocab.target.encode(line)] + [origin[3]]
        assert ours == tokenizer(text_target=line).input_ids, line


def test_the_logits_equal_transformers(model):
    _, path, hf, tokenizer = model
    assert_logits_equal(path, hf, tokenizer)  # mtx's source ids: a line of spaces differs


def test_scores_equal_the_sum_of_transformers_log_probabilities(model):
    """The target language's code is read, not scored: its label's log-probability is left
    out of transformers' sum."""
    _, path, hf, tokenizer = model
    sources, refs = lines(60)[2:], targets(60)[2:]
    scores = Scorer(translator(path).parts).score(sources, refs)
    for src, tgt, score in zip(sources, refs, scores):
        labels = torch.tensor([tokenizer(text_target=tgt).input_ids])
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([tokenizer(src).input_ids]), labels=labels).logits
        theirs = logits.log_softmax(-1)[0].gather(1, labels[0][:, None])[1:].sum().item()
        assert score.total == pytest.approx(theirs, abs=1e-3)
        assert score.tokens == labels.size(1) - 1


def generate(hf, tokenizer, sources: list[str], beam: int) -> list[list[int]]:
    """transformers' outputs under mtx's rules (test_import.py's), the target language's code
    forced first (`forced_bos_token_id`, as NLLB's model card has it); without the decoder
    start, the code and EOS."""
    out = []
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    code = tokenizer.convert_tokens_to_ids("deu_Latn")
    bad = [[pad], [tokenizer.unk_token_id], [tokenizer.bos_token_id]]
    for k in range(0, len(sources), 50):
        enc = tokenizer(sources[k : k + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            rows = hf.generate(
                **enc, num_beams=beam, do_sample=False, length_penalty=0.0, early_stopping=True,
                max_length=N + 2, bad_words_ids=bad, forced_bos_token_id=code,
                forced_eos_token_id=None, logits_processor=only_eos_at_the_limit(eos, N + 1),
            )  # fmt: skip
        for row in rows[:, 2:].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_generate(model, beam):
    _, path, hf, tokenizer = model
    assert_translations_equal(path, lambda s, k: generate(hf, tokenizer, s, k), beam, 15)


def test_the_target_language_is_chosen_by_tgt_lang(model):
    _, path, _, _ = model
    tr = translator(path)
    codec = tr.parts.codec
    assert codec.start() != codec.start("fra_Latn") == (codec.vocab.languages["fra_Latn"],)
    out = mtx("translate", "--checkpoint", path, "--tgt-lang", "fra_Latn", input="a man\n")
    assert out.stdout.splitlines() == texts(tr, ["a man"], tgt_lang="fra_Latn")
    info = json.loads(mtx("info", path, "--json").stdout)["config"]["model"]
    assert (info["norm"], info["positions"], info["decoder_start"]) == ("pre", "fairseq", "eos")


def broken(directory, tmp_path, change):
    copy = tmp_path / "broken"
    shutil.copytree(directory, copy)
    change(copy)
    return copy


def config_with(**changes):
    def change(d):
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(c | changes))

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: (d / "sentencepiece.bpe.model").unlink(), "no sentencepiece.bpe.model"),
        (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
         "no tokenizer.json or tokenizer_config.json"),
        (config_with(scale_embedding=False), "embeddings not scaled"),
        (config_with(activation_function="tanh"), "activation_function 'tanh'"),
        (config_with(d_model=20), "do not fit its config.json"),
    ],
)  # fmt: skip
def test_what_cannot_be_imported_is_refused_in_one_line(model, tmp_path, change, message):
    directory = broken(model[0], tmp_path, change)
    args = ("--src-lang", "eng_Latn", "--tgt-lang", "deu_Latn")
    result = invoke("import", directory, "--output", tmp_path / "out.pt", *args)
    assert result.exit_code != 0
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out.pt").exists()


def test_a_language_the_model_lacks_is_refused(model, tmp_path):
    result = invoke("import", model[0], "--output", tmp_path / "out.pt", "--src-lang", "en")
    assert (
        result.exit_code != 0 and "--src-lang must name one of its language codes" in result.output
    )
    assert not (tmp_path / "out.pt").exists()


def test_the_checkpoint_records_the_languages(model):
    ckpt = Checkpoint.load(model[1])
    assert ckpt.spm_model.startswith(b"PK")  # data/vocab.py's Paired, family nllb
    tr = translator(model[1])
    assert sorted(tr.parts.codec.vocab.languages) == sorted(nllb.CODES)
    assert (
        tr.parts.codec.vocab.decode(
            [*tr.parts.codec.start(), *tr.parts.codec.vocab.target.encode("ein mann")]
        )
        == "ein mann"
    )


def test_the_ctranslate2_export_translates_and_scores_as_mtx(model, tmp_path):
    """CTranslate2 reads the source's code first and takes the target's as `target_prefix`:
    greedy, the same outputs; its log-probabilities of mtx's beam outputs equal mtx's."""
    import ctranslate2

    _, path, _, _ = model
    mtx("export", path, "--format", "ctranslate2", "--output", tmp_path / "ct2")
    tr = translator(path, "decode.beam=1", "decode.max_len_a=0", f"decode.max_len_b={N}")
    sources = [x for x in lines(200) if x.split()]  # a line with no words is not decoded
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    piece, v = tr.parts.codec.vocab.id_to_piece, tr.parts.codec.vocab
    pieces = [[piece(i) for i in tr.parts.codec.encode(s)[:-1]] for s in sources]
    code = [piece(i) for i in tr.parts.codec.start()]
    results = ct2.translate_batch(
        pieces, target_prefix=[code] * len(pieces), beam_size=1, max_decoding_length=N,
        suppress_sequences=[["<pad>"], ["<unk>"], ["<s>"]],
    )  # fmt: skip
    theirs = [[v.piece_to_id(p) for p in r.hypotheses[0][1:]] for r in results]
    ours = [list(h[0].tokens) for h in outputs(tr, sources)]
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(sources), f"{same} of {len(sources)}"
    beam = [h[0] for h in outputs(tr, sources[:30], beam=4)]
    scored = ct2.score_batch(pieces[:30], [code + [piece(i) for i in h.tokens] for h in beam])
    for hyp, result in zip(beam, scored):  # the code's own log-probability not counted
        assert sum(result.log_probs[1:]) == pytest.approx(hyp.log_prob, abs=1e-3)


def test_the_export_gives_back_the_same_model(model, tmp_path):
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    files = ("sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json")
    load = M2M100ForConditionalGeneration.from_pretrained
    assert_exported_back(model, load, files, tmp_path / "back")
    tokenizer = model[3]
    again = NllbTokenizer.from_pretrained(tmp_path / "back", src_lang="eng_Latn")
    assert again("a man").input_ids == tokenizer("a man").input_ids


@pytest.mark.slow  # fine-tuning runs (test_import.py's MarianMT one runs in the default run)
def test_fine_tuning_starts_at_transformers_loss_and_resumes_exactly(model, tmp_path):
    """Prepared sources start with the source language's code and targets with the target's,
    as NllbTokenizer writes them; the decoder reads </s> then the target (the code's
    prediction in the loss, as transformers has it)."""
    import datasets

    from mtx.config import load_config
    from mtx.data.prepare import prepare
    from mtx.train.trainer import train

    _, path, hf, tokenizer = model
    quiet = dict(log=lambda *_: None)
    # a local corpus's files are named by its languages: here, the model's codes
    files = []
    for split in ("train", "valid", "test"):
        toy.write_split(split, tmp_path / "toy" / split, "eng_Latn", "deu_Latn")
        files.append(f"data.{split}={tmp_path / 'toy' / split}")
    langs = ("data.src_lang=eng_Latn", "data.tgt_lang=deu_Latn", *files)

    def settings(run, *extra):
        return fine_tuning(run, path, *langs, *extra)

    prepare(load_config(None, settings(tmp_path / "whole")), **quiet)
    shutil.copytree(tmp_path / "whole" / "prepared", tmp_path / "parts" / "prepared")
    tr = translator(path)
    origin = torch.tensor(tr.parts.codec.vocab.origin)
    ds = datasets.load_from_disk(str(tmp_path / "whole" / "prepared" / "train"))
    for row in ds.select(range(20)):
        assert origin[row["src_ids"]].tolist() == tokenizer(row["src"]).input_ids
        assert origin[row["tgt_ids"]].tolist() == tokenizer(text_target=row["tgt"]).input_ids
    assert_first_loss_is_transformers(tr, hf, tmp_path / "whole" / "prepared")
    train(load_config(None, settings(tmp_path / "whole", "train.max_steps=8")), **quiet)
    train(load_config(None, settings(tmp_path / "parts", "train.max_steps=5")), **quiet)
    train(
        load_config(None, settings(tmp_path / "parts", "train.max_steps=8")), resume=True, **quiet
    )
    assert_same_parameters(
        tmp_path / "whole/checkpoints/last.pt", tmp_path / "parts/checkpoints/last.pt"
    )
    valid = records(tmp_path / "whole", "valid")
    assert [r["step"] for r in valid] == [4, 8] and all("valid_bleu" in r for r in valid)
    tuned = translator(tmp_path / "whole/checkpoints/last.pt")
    assert tuned.parts.codec.start() == tr.parts.codec.start() and tuned.translate(["a man"])


def test_a_language_code_the_model_lacks_is_refused_before_preparing(model, tmp_path):
    cfg = fine_tuning(tmp_path / "run", model[1], "data.src_lang=en", "data.tgt_lang=deu_Latn")
    toy = Path(__file__).resolve().parents[1] / "configs" / "toy.yaml"
    result = invoke("prepare", "--config", toy, *[x for c in cfg for x in ("--set", c)])
    assert result.exit_code != 0 and "data.src_lang: 'en' is not a language code" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "prepared").exists()


def test_score_and_distill_take_an_imported_nllb_model(model, tmp_path):
    _, path, _, _ = model
    src, tgt = lines(12)[8:], targets(12)[8:]
    (tmp_path / "src").write_text("\n".join(src) + "\n")
    (tmp_path / "tgt").write_text("\n".join(tgt) + "\n")
    scored = mtx(
        "score", "--checkpoint", path, "--src", tmp_path / "src", "--tgt", tmp_path / "tgt"
    )
    expected = Scorer(translator(path).parts).score(src, tgt)
    totals = [float(line.split()[0]) for line in scored.stdout.splitlines()]
    assert totals == pytest.approx([s.total for s in expected], abs=1e-4)
    mtx("distill", "--checkpoint", path, "--src", tmp_path / "src", "--output-dir", tmp_path / "d")
    out = (tmp_path / "d" / "teacher.deu_Latn").read_text().splitlines()
    assert out == texts(translator(path, "decode.alpha=0.6"), src)


def test_serve_takes_an_imported_nllb_model_and_its_target_languages(model):
    from mtx.bench.server import Server

    _, path, _, _ = model
    texts = lines(20)[8:]
    tr = translator(path, "decode.alpha=0.6")
    with Server(path, "serve.workers=1") as server:
        status, answer = server.translate(texts)
        assert (status, answer["translations"]) == (200, translating.texts(tr, texts))
        status, answer = server.translate(texts, tgt_lang="fra_Latn")
        expected = translating.texts(tr, texts, tgt_lang="fra_Latn")
        assert (status, answer["translations"]) == (200, expected)
        assert server.stop() == 0


@pytest.mark.slow  # a benchmark's own run
def test_bench_decode_races_an_nllb_model_by_mtx_alone(model, tmp_path):
    """The peers' runners give no target-language code: they are left out, saying why."""
    _, path, _, _ = model
    (tmp_path / "src").write_text("\n".join(lines(20)[8:14]) + "\n")
    (tmp_path / "ref").write_text("\n".join(targets(20)[8:14]) + "\n")
    args = ("--src", tmp_path / "src", "--ref", tmp_path / "ref", "--engines", "mtx,ct2")
    result = invoke("bench", "decode", "--checkpoint", path, *args, "--rounds", "1", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert {r["engine"] for r in out["results"]} == {"mtx"}
    assert any("an NLLB model is raced by mtx alone" in x for x in out["left_out"])
