"""End to end through the `mtx` command line: toy corpus, real data, errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MULTI30K
from helpers.common import invoke, mtx, records

from mtx.checkpoint import Checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_toy_training_writes_checkpoints_and_metrics(toy_run):
    assert (toy_run / "checkpoints" / "last.pt").is_file()
    assert (toy_run / "checkpoints" / "best.pt").is_file()
    train, valid = records(toy_run, "train"), records(toy_run, "valid")
    assert [r["step"] for r in valid] == [125, 250]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    assert all(r["tokens_per_s"] > 0 for r in train)
    best = Checkpoint.load(toy_run / "checkpoints" / "best.pt")
    assert all(0 <= r["valid_bleu"] <= 100 for r in valid)  # the toy config: best by BLEU
    assert best.step == max(valid, key=lambda r: r["valid_bleu"])["step"]


def test_toy_model_translates_far_better_than_an_untrained_one(toy_run):
    ckpt = toy_run / "checkpoints" / "best.pt"
    result = mtx("evaluate", "--checkpoint", ckpt, "--split", "test", "--beam", "1", "--json")
    scores = json.loads(result.stdout)
    assert scores["bleu"] > 35, scores  # an untrained model scores about 0
    assert scores["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert {"bleu", "chrf", "signature"} <= scores.keys()


def test_translate_keeps_one_line_per_input_line_in_order(toy_run, tmp_path):
    ckpt = toy_run / "checkpoints" / "best.pt"
    lines = [
        "the dog sleeps.",
        "",
        "   ",
        "a cat\tsees\x07 the\x00 bird.",
        "the man " * 400,
        "the woman laughs.",
        "",
        "the dog sleeps.",
    ]
    out = mtx(
        "translate", "--checkpoint", ckpt, "--chunk-lines", 3, input="\n".join(lines) + "\n"
    ).stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[0] == out[7]  # the same sentence translates the same wherever it stands
    assert out[0].startswith("der hund")
    single = mtx("translate", "--checkpoint", ckpt, input="the woman laughs.\n").stdout
    assert single == out[5] + "\n"


def test_translate_nbest_sampling_and_stopping_options(toy_run):
    ckpt = toy_run / "checkpoints" / "best.pt"
    lines = "the dog sleeps.\na cat sees the bird.\n"
    rows = mtx("translate", "--checkpoint", ckpt, "--nbest", 3, input=lines).stdout.splitlines()
    assert len(rows) == 6
    fields = [row.split(" ||| ") for row in rows]
    assert [f[0] for f in fields] == ["0", "0", "0", "1", "1", "1"]
    for group in (fields[:3], fields[3:]):
        scores = [float(f[2]) for f in group]
        assert scores == sorted(scores, reverse=True) and len({f[1] for f in group}) == 3
        assert all(float(f[3]) <= float(f[2]) <= 0 for f in group)  # log P / lp, lp >= 1
    best = mtx("translate", "--checkpoint", ckpt, input=lines).stdout.splitlines()
    assert best == [fields[0][1], fields[3][1]]
    exact = mtx("translate", "--checkpoint", ckpt, "--stopping", "exact", input=lines).stdout
    assert len(exact.splitlines()) == 2
    sample = ["translate", "--checkpoint", ckpt, "--sample", "--temperature", 5, "--seed", 1]
    many = "the dog sleeps.\n" * 6
    first, again = (mtx(*sample, input=many).stdout for _ in range(2))
    assert first == again and len(set(first.splitlines())) > 1  # seeded per line
    assert mtx(*sample[:-1], 2, input=many).stdout != first
    bad = invoke("translate", "--checkpoint", ckpt, "--nbest", "9", input="x\n")
    assert bad.exit_code == 2 and "needs a beam of at least 9" in bad.output
    bad = invoke("translate", "--checkpoint", ckpt, "--top-p", "0", input="x\n")
    assert bad.exit_code == 2 and "top_p must be in (0, 1], got 0.0" in bad.output


def test_evaluate_scores_a_hypothesis_file(tmp_path):
    (tmp_path / "hyp.de").write_text("der hund schläft.\ndie katze lacht.\n")
    (tmp_path / "ref.de").write_text("der hund schläft.\ndie katze lacht.\n")
    scores = json.loads(
        mtx("evaluate", "--hyp", tmp_path / "hyp.de", "--ref", tmp_path / "ref.de", "--json").stdout
    )
    assert scores["bleu"] == 100.0 and scores["chrf"] == 100.0
    (tmp_path / "short.de").write_text("der hund schläft.\n")
    result = invoke("evaluate", "--hyp", tmp_path / "short.de", "--ref", tmp_path / "ref.de")
    assert result.exit_code == 2 and "1 hypotheses but 2 references" in result.output


def test_info_reports_the_papers_parameter_counts():
    base = json.loads(mtx("info", ROOT / "configs/base.yaml", "--json").stdout)
    big = json.loads(mtx("info", ROOT / "configs/big.yaml", "--json").stdout)
    assert abs(base["parameters"] / 65e6 - 1) < 0.04
    assert abs(big["parameters"] / 213e6 - 1) < 0.04
    assert base["flops_per_token"] > 6 * base["parameters"] * 0.5
    assert "post-norm" in base["architecture"] and "sinusoidal positions" in base["architecture"]
    sets = ["--set", "model.norm=pre", "--set", "model.positions=relative"]
    variant = json.loads(mtx("info", ROOT / "configs/base.yaml", *sets, "--json").stdout)
    assert "pre-norm" in variant["architecture"]
    assert "relative positions (distances clipped at 16)" in variant["architecture"]
    # two LayerNorms more; in each of the 12 self-attention layers 2 x 8 heads x 33 x 64
    extra = 2 * 2 * 512 + 12 * 2 * 8 * 33 * 64
    assert variant["parameters"] == base["parameters"] + extra
    sets = ["--set", "model.arch=rnn", "--set", "model.rnn_cell=gru"]
    rnn = json.loads(mtx("info", ROOT / "configs/base.yaml", *sets, "--json").stdout)
    assert rnn["architecture"] == (
        "rnn gru, 6-layer bidirectional encoder, 6-layer decoder with input feeding, "
        "d_model 512, general attention, shared embeddings"
    )
    d, V = 512, rnn["vocab_size"]
    encoder = 6 * 2 * (3 * 256 * (512 + 256) + 2 * 3 * 256)
    decoder = 3 * d * 3 * d + 2 * 3 * d + 5 * (3 * d * 2 * d + 2 * 3 * d)
    others = V * d + d * 6 * d + 6 * d + 2 * d * d + d * d  # + bridge, W_c, W_a
    assert rnn["parameters"] == encoder + decoder + others
    assert rnn["flops_per_token"] > 0


def test_info_on_a_checkpoint(toy_run):
    facts = json.loads(mtx("info", toy_run / "checkpoints" / "best.pt", "--json").stdout)
    assert facts["step"] == 250 and facts["parameters"] > 0


def test_user_errors_are_one_line_with_exit_code_2(tmp_path):
    for args, message in [
        (["train", "--config", tmp_path / "nope.yaml"], "config file not found"),
        (
            ["info", ROOT / "configs/toy.yaml", "--set", "model.d_modle=3"],
            "did you mean model.d_model",
        ),
        (["translate", "--checkpoint", tmp_path / "none.pt"], "checkpoint not found"),
        (
            ["train", "--config", ROOT / "configs/toy.yaml", "--set", f"run_dir={tmp_path}"],
            "run `mtx prepare`",
        ),
    ]:
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_installed_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "mtx", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("prepare", "train", "translate", "evaluate", "info"):
        assert command in out.stdout


def test_multi30k_prepare_train_translate_evaluate(multi30k_run, tmp_path):
    manifest = json.loads((multi30k_run / "prepared" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["read"] == 29000
    assert manifest["splits"]["test"]["kept"] == 1000
    losses = [r["loss"] for r in records(multi30k_run, "train")]
    assert losses[-1] < losses[0]
    src = (MULTI30K / "test2016.en").read_text().splitlines()[:50]
    ref = (MULTI30K / "test2016.de").read_text().splitlines()[:50]
    (tmp_path / "src.en").write_text("\n".join(src) + "\n")
    (tmp_path / "ref.de").write_text("\n".join(ref) + "\n")
    ckpt = multi30k_run / "checkpoints" / "best.pt"
    scores = json.loads(
        mtx(
            "evaluate",
            "--checkpoint",
            ckpt,
            "--src",
            tmp_path / "src.en",
            "--ref",
            tmp_path / "ref.de",
            "--beam",
            "2",
            "--output",
            tmp_path / "hyp.de",
            "--json",
        ).stdout
    )
    assert scores["lines"] == 50 and 0 <= scores["bleu"] <= 100
    assert len((tmp_path / "hyp.de").read_text().splitlines()) == 50


@pytest.mark.slow
def test_the_demo_reaches_bleu_90_on_the_toy_test_split(tmp_path):
    """What `make demo` does, with the full toy config (about 3 minutes on 2 CPU cores)."""
    sets = ["--set", f"run_dir={tmp_path}"]
    mtx("prepare", "--config", ROOT / "configs/toy.yaml", *sets)
    mtx("train", "--config", ROOT / "configs/toy.yaml", *sets)
    mtx("toy", "--output", tmp_path / "test", "--split", "test")
    scores = json.loads(
        mtx(
            "evaluate",
            "--checkpoint",
            tmp_path / "checkpoints" / "best.pt",
            "--src",
            tmp_path / "test.en",
            "--ref",
            tmp_path / "test.de",
            "--json",
        ).stdout
    )
    assert scores["bleu"] >= 90, scores


def test_a_checkpoint_with_overridden_model_keys_is_a_clear_error(toy_run):
    ckpt = toy_run / "checkpoints" / "best.pt"
    result = invoke("translate", "--checkpoint", ckpt, "--set", "model.d_ff=64", input="x\n")
    assert result.exit_code == 2 and "do not fit the model config" in result.output
