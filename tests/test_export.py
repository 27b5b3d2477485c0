"""`mtx export`: the Hugging Face MarianMT and CTranslate2 exports compute what mtx computes."""

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace

import ctranslate2
import pytest
import torch
from conftest import tiny_model_config
from helpers.common import mtx
from helpers.translating import outputs, texts
from transformers import MarianMTModel, MarianTokenizer

from mtx.checkpoint import Checkpoint
from mtx.config import Config, DecodeConfig
from mtx.data import toy
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.files import sha256_file
from mtx.formats import export
from mtx.formats.marian import to_marian
from mtx.formats.weights import marian_permutation
from mtx.model.positions import sinusoidal_table
from mtx.model.transformer import Transformer
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

LINES = 200  # toy test lines translated by each engine


@pytest.fixture(scope="module")
def toy_test():
    pairs = toy.split_pairs("test")[:LINES]
    return [src for src, _ in pairs]


@pytest.fixture(scope="module")
def hf_dir(toy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    export(toy_run / "checkpoints" / "best.pt", "hf", out)
    return out


@pytest.fixture(scope="module")
def ct2_dir(toy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "ct2"
    export(toy_run / "checkpoints" / "best.pt", "ctranslate2", out)
    return out


@pytest.fixture(scope="module")
def translator(toy_run):
    # alpha 0: every engine then ranks hypotheses by their summed log-probability (Marian and
    # CTranslate2 normalise by length ** alpha, mtx by ((5 + length) / 6) ** alpha)
    return Translator.from_checkpoints(
        toy_run / "checkpoints" / "best.pt", ["decode.alpha=0"], device="cpu"
    )


def by_length_limit(translator, lines):
    """Groups of line indices sharing mtx's output length limit (EOS included; source tokens
    + 50), so that engines with one limit per batch get the same limit as mtx."""
    groups = defaultdict(list)
    for i, line in enumerate(lines):
        groups[len(translator.parts.codec.encode(line)) - 1 + 50].append(i)
    return groups.items()


def test_marian_position_table_is_ours_permuted():
    ours = sinusoidal_table(50, 16)
    m = tiny_model_config(d_model=16)
    hf = to_marian(Transformer(m, 40), Config(model=m))
    table = hf.model.encoder.embed_positions.weight[:50]  # the table Marian builds itself
    torch.testing.assert_close(table, ours[:, marian_permutation(16)], atol=1e-6, rtol=0)
    assert not torch.allclose(table, ours, atol=0.1)  # and a different layout from ours


def test_hf_export_gives_mtx_logits(hf_dir, translator, toy_test):
    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    model = translator.parts.model
    src = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(translator.parts.codec.encode(line)) for line in toy_test[:16]],
        batch_first=True,
        padding_value=PAD_ID,
    )
    tgt = torch.randint(4, model.vocab_size, (16, 12))
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        ours = model(src, tgt)
        theirs = hf(input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=tgt).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    assert ours.abs().max() > 1  # not a vacuous comparison


def test_hf_tokenizer_gives_mtx_token_ids(hf_dir, translator, toy_test):
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    for line in toy_test:
        assert tokenizer(line).input_ids == translator.parts.codec.encode(line)


def test_hf_generate_translates_as_mtx_does(hf_dir, translator, toy_test):
    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    assert hf.generation_config.num_beams == 4
    assert hf.generation_config.early_stopping is True  # mtx's stopping rule
    ours = texts(translator, toy_test)
    theirs = [""] * len(toy_test)
    for limit, lines in by_length_limit(translator, toy_test):
        batch = tokenizer([toy_test[i] for i in lines], return_tensors="pt", padding=True)
        out = hf.generate(**batch, length_penalty=0.0, early_stopping=True, max_new_tokens=limit)
        for i, text in zip(lines, tokenizer.batch_decode(out, skip_special_tokens=True)):
            theirs[i] = text
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(toy_test), [(a, b) for a, b in zip(ours, theirs) if a != b][:3]


def test_ct2_export_scores_and_translates_as_mtx_does(ct2_dir, translator, toy_test):
    sp, model = translator.parts.codec.vocab.sp, translator.parts.model
    proto = sp.serialized_model_proto()
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu")
    pieces = [sp.encode(line, out_type=str) for line in toy_test]
    # Scores of forced outputs: CTranslate2's log-probabilities equal the model's.
    ours = outputs(translator, toy_test[:20])
    targets = [[sp.id_to_piece(i) for i in h[0].tokens] for h in ours]
    scored = ct2.score_batch(pieces[:20], targets)
    with torch.no_grad():
        for line, hyp, result in zip(toy_test, ours, scored):
            src = torch.tensor([translator.parts.codec.encode(line)])
            tgt = torch.tensor([[BOS_ID, *hyp[0].tokens]])
            lprobs = torch.log_softmax(model(src, tgt)[0], -1)
            expected = lprobs[torch.arange(tgt.size(1)), [*hyp[0].tokens, EOS_ID]]
            torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)
    # Greedy search: the same translations.
    greedy = Translator(model, replace(translator.parts.config, decode=DecodeConfig(beam=1)), proto)
    mine = texts(greedy, toy_test)
    theirs = [""] * len(toy_test)
    for limit, lines in by_length_limit(translator, toy_test):
        results = ct2.translate_batch(
            [pieces[i] for i in lines],
            beam_size=1,
            max_decoding_length=limit - 1,  # CTranslate2 does not count the EOS
            suppress_sequences=[[sp.id_to_piece(i)] for i in (PAD_ID, UNK_ID, BOS_ID)],
        )
        for i, result in zip(lines, results):
            theirs[i] = sp.decode(result.hypotheses[0])
    assert mine == theirs


def test_ct2_beam_search_differs_only_where_it_searches_longer(ct2_dir, translator, toy_test):
    """CTranslate2 ends a sentence's beam search when its best candidate ends; mtx (like
    fairseq and Hugging Face's early_stopping=True) when it has K finished hypotheses. Where
    the two differ, CTranslate2 must have found an output the model scores higher."""
    sp = translator.parts.codec.vocab.sp
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu")
    mine = outputs(translator, toy_test)
    differ = 0
    for limit, lines in by_length_limit(translator, toy_test):
        results = ct2.translate_batch(
            [sp.encode(toy_test[i], out_type=str) for i in lines],
            beam_size=4,
            length_penalty=0.0,
            max_decoding_length=limit - 1,
            return_scores=True,
        )
        for i, result in zip(lines, results):
            ids = [sp.piece_to_id(p) for p in result.hypotheses[0]]
            if ids != list(mine[i][0].tokens):
                differ += 1
                assert result.scores[0] > mine[i][0].score
    assert differ <= 0.05 * len(toy_test)


def test_ct2_int8_quantization_is_written(toy_run, tmp_path):
    out = tmp_path / "int8"
    about = export(toy_run / "checkpoints" / "best.pt", "ctranslate2", out, "int8")
    assert about["format"] == "ctranslate2 (int8)"
    ct2 = ctranslate2.Translator(str(out), device="cpu", compute_type="int8")
    assert ct2.translate_batch([["▁the"]])[0].hypotheses[0]  # it loads and translates


def test_an_export_describes_its_model(hf_dir, toy_run):
    about = json.loads((hf_dir / "mtx.json").read_text())
    ckpt = Checkpoint.load(toy_run / "checkpoints" / "best.pt")
    assert about["config"] == ckpt.config.to_dict() and about["step"] == ckpt.step
    assert about["checkpoint_sha256"] == sha256_file(toy_run / "checkpoints" / "best.pt")
    assert about["manifest"]["splits"]["train"]["source"] == "toy:train"


def test_export_refuses_what_it_cannot_do(toy_run, tmp_path):
    best = toy_run / "checkpoints" / "best.pt"
    with pytest.raises(MtxError, match="layer_norm_eps"):
        m = tiny_model_config(layer_norm_eps=1e-6)
        to_marian(Transformer(m, 40), Config(model=m))
    with pytest.raises(MtxError, match="--format must be one of hf, ctranslate2"):
        export(best, "onnx", tmp_path / "x")
    with pytest.raises(MtxError, match="applies to --format ctranslate2 only"):
        export(best, "hf", tmp_path / "x", "int8")
    with pytest.raises(MtxError, match="--quantization must be one of"):
        export(best, "ctranslate2", tmp_path / "x", "int3")
    variant = Checkpoint.load(best)
    variant.config.model.norm = "pre"
    variant.save(tmp_path / "pre.pt")
    with pytest.raises(MtxError, match="model.norm=pre"):
        export(tmp_path / "pre.pt", "ctranslate2", tmp_path / "x")
    variant.config.model.norm, variant.config.model.arch = "post", "rnn"
    variant.save(tmp_path / "pre.pt")
    with pytest.raises(MtxError, match="model.arch=rnn"):
        export(tmp_path / "pre.pt", "hf", tmp_path / "x")
    (tmp_path / "pre.pt").unlink()
    (tmp_path / "taken").mkdir()
    with pytest.raises(MtxError, match="already exists"):
        export(best, "hf", tmp_path / "taken")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # nothing half-written


@pytest.mark.slow
def test_the_decoding_race_runs_every_engine_on_the_same_work(toy_run, toy_test, tmp_path):
    """`mtx bench decode` (benchmarks/decode.py): each engine translates the same batches; the
    peers (same weights, alpha 0, mtx's length limit) give mtx's greedy output."""
    src = tmp_path / "src.en"
    src.write_text("".join(line + "\n" for line in toy_test[:40]), encoding="utf-8")
    (tmp_path / "src.de").write_text("".join(line + "\n" for line in toy_test[1:41]), "utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "mtx", "bench", "decode", "--checkpoint",
         str(toy_run / "checkpoints" / "best.pt"), "--src", str(src), "--beam", "1",
         "--batch", "8", "--rounds", "1", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["benchmark"] == "decode" and report["machine"]["cores"] >= 1
    rows = {r["engine"]: r for r in report["results"]}
    assert set(rows) == {"mtx", "mtx-int8", "hf", "ct2", "ct2-int8"}
    assert all(r["spread"] == 0 for r in rows.values())  # one round each (a process each)
    assert all(r["lines"] == 40 and r["tokens_per_s"] > 0 for r in rows.values())
    assert rows["hf"]["same_as_mtx"] == rows["ct2"]["same_as_mtx"] == 1.0
    # BLEU against src.de, found beside the source: equal outputs, equal scores
    assert all(0 <= r["bleu"] <= 100 for r in rows.values())
    assert rows["hf"]["bleu"] == rows["ct2"]["bleu"] == rows["mtx"]["bleu"]
    assert rows["mtx-int8"]["dtype"] == "int8" and rows["mtx-int8"]["same_as_mtx"] > 0.5
    assert rows["mtx-int8"]["speedup_vs_ct2-int8"] == pytest.approx(
        rows["mtx-int8"]["tokens_per_s"] / rows["ct2-int8"]["tokens_per_s"]
    )
    assert rows["mtx"]["speedup_vs_hf"] == pytest.approx(
        rows["mtx"]["tokens_per_s"] / rows["hf"]["tokens_per_s"]
    )
    assert [rows[e]["dtype"] for e in ("mtx", "hf")] == ["float32"] * 2


@pytest.mark.slow
def test_the_decoding_race_runs_mtx_in_translate_s_own_batches(toy_run, toy_test, tmp_path):
    """--batch-tokens: the mtx engines translate every line through translate_ids's
    batches (lengths mixed), the same outputs as batches of one length (batch independence);
    the peers are left out, and said."""
    src = tmp_path / "src.en"
    src.write_text("".join(line + "\n" for line in toy_test[:40]), encoding="utf-8")
    (tmp_path / "src.de").write_text("".join(line + "\n" for line in toy_test[:40]), "utf-8")
    reports = []
    for batching in (["--batch", "8"], ["--batch-tokens", "96"]):
        out = mtx("bench", "decode", "--checkpoint", toy_run / "checkpoints" / "best.pt",
                  "--src", src, "--beam", "2", "--engines", "mtx,hf", "--rounds", "1",
                  *batching, "--json")  # fmt: skip
        reports.append(json.loads(out.stdout.splitlines()[-1]))
    by_length, by_tokens = reports
    [row] = by_tokens["results"]
    assert row["engine"] == "mtx" and row["batch"] == "96 tokens" and row["lines"] == 40
    assert by_tokens["left_out"] == ["hf: --batch-tokens races mtx's own batching only"]
    mtx_row = next(r for r in by_length["results"] if r["engine"] == "mtx")
    assert row["bleu"] == mtx_row["bleu"] > 0
    assert row["tokens_per_s"] * row["seconds"] == pytest.approx(
        mtx_row["tokens_per_s"] * mtx_row["seconds"]
    )  # the same number of output tokens


# slow: a second full race (20 s); the race itself runs in make test
@pytest.mark.slow
def test_the_decoding_race_runs_every_engine_in_the_dtype_asked(toy_run, toy_test, tmp_path):
    src = tmp_path / "src.en"
    src.write_text("".join(line + "\n" for line in toy_test[:16]), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "mtx", "bench", "decode", "--checkpoint",
         str(toy_run / "checkpoints" / "best.pt"), "--src", str(src), "--beam", "1",
         "--batch", "8", "--dtype", "bf16", "--engines", "mtx,hf", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["settings"]["dtype"] == "bf16"
    assert [r["dtype"] for r in report["results"]] == ["bfloat16"] * 2
    assert all(r["bleu"] is None for r in report["results"])  # no src.de beside the source
    assert all(r["lines"] == 16 and r["tokens_per_s"] > 0 for r in report["results"])
