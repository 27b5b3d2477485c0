"""Bad input through the `mtx` command line: one line naming the file, line or key, exit code 2,
no traceback (unless --debug) and nothing half-written. And input that looks bad but is fine."""

import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from conftest import run_config
from helpers.common import invoke, write_pair
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtx.checkpoint import Checkpoint
from mtx.cli import read_lines
from mtx.data import sources
from mtx.decode.translator import Translator
from mtx.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]


GOOD = (
    ["the dog sleeps .", "a cat sees a dog ."] * 10,
    ["der hund schläft .", "eine katze ."] * 10,
)


def corpus(tmp_path: Path, problem: str) -> list[str]:
    """Write a small corpus with one problem in its training split; returns --set values."""
    src, tgt = GOOD
    write_pair(tmp_path / "good", src, tgt)
    train = tmp_path / "train"
    if problem == "missing":
        train = tmp_path / "missing"
    elif problem == "line counts":
        write_pair(train, src, tgt[:-1])
    elif problem == "empty file":
        write_pair(train, [], [])
    elif problem == "empty after cleaning":
        write_pair(train, ["", "  ", "a"], ["x", "", ""])
    elif problem == "invalid utf-8":
        write_pair(train, src, tgt)
        (tmp_path / "train.de").write_bytes(b"der hund\nein \xc3\x28 kaputt\n" + b"x\n" * 18)
    elif problem == "too long after cleaning":
        write_pair(train, ["word " * 400] * 3, ["wort " * 400] * 3)
    return [
        f"run_dir={tmp_path / 'run'}",
        f"data.train={train}",
        f"data.valid={tmp_path / 'good'}",
        f"data.test={tmp_path / 'good'}",
        "data.vocab_size=40",
        "data.max_len=100",
        "data.dedup=false",  # GOOD repeats its pairs on purpose
        "train.max_tokens=512",
    ]


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()  # progress lines may come first
    assert lines[-1].startswith("mtx: error: "), result.output
    assert sum("error" in line for line in lines) == 1 and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


def sets(values: list[str]) -> list[str]:
    return [x for value in values for x in ("--set", value)]


@pytest.mark.parametrize(
    "problem, fragments",
    [
        ("missing", ["file not found", "missing.en"]),
        ("line counts", ["train.en has 20 lines but", "train.de has 19"]),
        ("empty file", ["train.en and", "train.de are empty"]),
        ("empty after cleaning", ["data.train", "no usable pairs"]),
        ("invalid utf-8", ["train.de:2: invalid UTF-8"]),
        ("too long after cleaning", ["data.train", "empty after cleaning (max_len 100)"]),
    ],
)
def test_bad_corpora_are_one_line_errors_and_leave_nothing_behind(tmp_path, problem, fragments):
    result = invoke(
        "prepare", "--config", ROOT / "configs/toy.yaml", *sets(corpus(tmp_path, problem))
    )
    assert_one_line_error(result, *fragments)
    run = tmp_path / "run"
    assert not (run / "prepared").exists() and not (run / "prepared.tmp").exists()


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("train.max_tokenz=100", ["unknown config key train.max_tokenz", "train.max_tokens"]),
        ("model.d_model=big", ["model.d_model expects int", "'big'"]),
        ("model.n_heads=5", ["model.d_model (128) must be divisible by model.n_heads (5)"]),
        ("data.vocab_size=0", ["data.vocab_size must be positive"]),
    ],
)
def test_bad_config_values_name_the_key(tmp_path, override, fragments):
    result = invoke("prepare", "--config", ROOT / "configs/toy.yaml", "--set", override)
    assert_one_line_error(result, *fragments)


def test_a_bad_key_in_a_yaml_file_names_the_file_and_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  d_model: 64\n  n_head: 4\n")
    assert_one_line_error(invoke("info", config), "c.yaml", "model.n_head", "model.n_heads")


def test_yaml_that_would_construct_python_objects_is_refused(tmp_path):
    config = tmp_path / "evil.yaml"
    config.write_text('model: !!python/object/apply:os.system ["touch /tmp/mtx-yaml-pwned"]\n')
    assert_one_line_error(invoke("info", config), "evil.yaml: not valid YAML")
    assert not Path("/tmp/mtx-yaml-pwned").exists()


def test_a_hub_dataset_while_offline_says_it_is_the_network(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub (offline mode is enabled)")

    monkeypatch.setattr(sources.datasets, "load_dataset", offline)
    values = corpus(tmp_path, "none") + ["data.train=hf:wmt/wmt14:de-en"]
    result = invoke("prepare", "--config", ROOT / "configs/base.yaml", *sets(values))
    assert_one_line_error(result, "'hf:wmt/wmt14:de-en'", "network", "local files")


def test_an_unreachable_hub_fails_at_once_and_leaves_no_run_folder(tmp_path, monkeypatch):
    """No retries: the hub is tried once (one connection), and the run folder a failed
    prepare made is gone."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens

    def never(*args, **kwargs):
        raise AssertionError("datasets was asked, and would have retried")

    monkeypatch.setattr(sources.datasets, "load_dataset", never)
    run = tmp_path / "runs" / "base"
    values = [*corpus(tmp_path, "none"), "data.train=hf:wmt/wmt14:de-en", f"run_dir={run}"]
    result = invoke("prepare", "--config", ROOT / "configs/base.yaml", *sets(values))
    assert_one_line_error(result, "'hf:wmt/wmt14:de-en'", "cannot reach http://127.0.0.1:9")
    assert not (tmp_path / "runs").exists()


def test_an_unusable_run_dir_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    values = corpus(tmp_path, "none") + [f"run_dir={tmp_path / 'file' / 'run'}"]
    result = invoke("prepare", "--config", ROOT / "configs/toy.yaml", *sets(values))
    assert_one_line_error(result, "file/run", "Not a directory")


def test_a_missing_split_says_how_to_get_it(tmp_path, monkeypatch):
    """The Multi30k recipe before `mtx fetch multi30k`: the error says to fetch it; a local
    split of no corpus mtx fetches says what a local split is."""
    monkeypatch.chdir(tmp_path)
    run = f"run_dir={tmp_path / 'run'}"
    result = invoke("prepare", "--config", ROOT / "configs/multi30k.yaml", "--set", run)
    fetch = "`mtx fetch multi30k --output data/multi30k` downloads it"
    assert_one_line_error(result, "file not found: data/multi30k/train.en", fetch)
    values = [*sets([f"data.train={tmp_path / 'mine'}", run])]
    result = invoke("prepare", "--config", ROOT / "configs/multi30k.yaml", *values)
    assert_one_line_error(result, "mine.en (a local split is a prefix P of P.en, P.de)")
    assert not (tmp_path / "run").exists()


def test_debug_shows_the_traceback(tmp_path):
    result = invoke("--debug", "prepare", "--config", ROOT / "configs/toy.yaml", "--set", "x=1")
    assert result.exit_code != 0 and "unknown config key" in str(result.exception)


def test_crlf_and_100000_character_lines_prepare_fine(tmp_path):
    src, tgt = GOOD
    long_src, long_tgt = "a" * 100_000, "b " * 50_000
    for prefix in ("train", "test"):
        for lang, lines in (("en", [*src, long_src]), ("de", [*tgt, long_tgt])):
            (tmp_path / f"{prefix}.{lang}").write_bytes("".join(x + "\r\n" for x in lines).encode())
    values = corpus(tmp_path, "none") + [
        f"data.train={tmp_path / 'train'}",
        f"data.test={tmp_path / 'test'}",
    ]
    result = invoke("prepare", "--config", ROOT / "configs/toy.yaml", *sets(values))
    assert result.exit_code == 0, result.output
    ds = datasets.load_from_disk(str(tmp_path / "run" / "prepared" / "test"))
    assert ds["src"][0] == "the dog sleeps ." and "\r" not in ds["tgt"][0]
    assert len(ds) == 21 and len(ds["src"][-1]) == 100_000  # test pairs are never dropped
    train_ds = datasets.load_from_disk(str(tmp_path / "run" / "prepared" / "train"))
    assert len(train_ds) == 20  # the long pair is dropped from training


# --- checkpoints and translate input --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("tiny")
    train(run_config(run, prepared, "train.max_steps=2"), log=lambda *_: None)
    return run / "checkpoints" / "best.pt"


def test_a_checkpoint_whose_vocabulary_does_not_match_its_sentencepiece_model(
    tiny_checkpoint, tmp_path
):
    odd = Checkpoint.load(tiny_checkpoint)
    odd.vocab_size += 8
    weights = odd.model["embed.weight"]
    odd.model["embed.weight"] = torch.cat([weights, weights[:8]])
    odd.save(tmp_path / "odd.pt")
    result = invoke("translate", "--checkpoint", tmp_path / "odd.pt", input="hello\n")
    assert_one_line_error(result, "pieces but the model's vocabulary has", "do not belong together")


def test_awkward_translate_input_keeps_one_output_line_per_input_line(tiny_checkpoint):
    lines = [
        b"",
        b"   \t ",
        b"the dog\x00 sleeps\x07\x1b[31m.",
        b"a cat \xff\xfe invalid bytes",  # replaced, as documented
        b"word " * 2000,  # 10,000 characters
        b"line\rwith\x0bodd\x0cbreaks\xc2\x85and\xe2\x80\xa8separators",
        b"the end.",
    ]
    data = b"\n".join(lines) + b"\n"
    result = invoke("translate", "--checkpoint", tiny_checkpoint, "--beam", 2, input=data)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == len(lines) and result.stdout.endswith("\n")


def test_translate_into_a_pipe_that_closes_early_stops_quietly(tiny_checkpoint):
    cmd = [sys.executable, "-m", "mtx", "translate", "--checkpoint", str(tiny_checkpoint)]
    proc = subprocess.Popen(
        [*cmd, "--chunk-lines", "1", "--beam", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdin.write(b"the dog sleeps.\n" * 300)
    proc.stdin.close()
    assert proc.stdout.readline().endswith(b"\n")
    proc.stdout.close()  # as `| head -1` does
    assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in proc.stderr.read()


def test_unwritable_outputs_are_one_line_errors(tmp_path):
    (tmp_path / "file").write_text("")
    result = invoke("toy", "--output", tmp_path / "file" / "toy")
    assert_one_line_error(result, str(tmp_path / "file"))


@pytest.fixture(scope="module")
def tiny_translator(tiny_checkpoint):
    return Translator.from_checkpoints(tiny_checkpoint, ["decode.beam=2"], device="cpu")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.text(max_size=60), min_size=1, max_size=8))
def test_random_unicode_input_keeps_the_line_count(tiny_translator, texts):
    # what `mtx translate` does with stdin: bytes split on "\n" only, then translated in chunks
    data = "\n".join(texts).encode("utf-8") + b"\n"
    lines = list(read_lines(io.BytesIO(data)))
    assert len(lines) == data.count(b"\n")
    out = [t.best.text for t in tiny_translator.stream(iter(lines), chunk_lines=3)]
    assert len(out) == len(lines) and not any("\n" in o for o in out)
    # a line with no words gets the empty translation
    assert all(o == "" for o, line in zip(out, lines) if not line.split())


# --- nothing mtx writes is world-writable ---------------------------------------------------


def test_nothing_written_is_world_writable_even_with_umask_0(tmp_path, prepared):
    src, tgt = GOOD
    write_pair(tmp_path / "c", src, tgt)
    values = sets(
        corpus(tmp_path, "none")[:1]
        + [f"data.{s}={tmp_path / 'c'}" for s in ("train", "valid", "test")]
    )
    values += sets(["data.vocab_size=40", "model.d_model=16", "model.d_ff=16", "model.n_heads=2"])
    values += sets(["model.encoder_layers=1", "model.decoder_layers=1", "train.max_steps=2"])
    values += sets(["train.max_tokens=512", "data.max_len=100", "train.device=cpu"])
    config = ROOT / "configs/toy.yaml"
    script = " && ".join(
        [
            f"{sys.executable} -m mtx prepare --config {config} {' '.join(values)}",
            f"{sys.executable} -m mtx train --config {config} {' '.join(values)}",
            f"{sys.executable} -m mtx toy --output {tmp_path / 'run' / 'toy'} --split valid",
        ]
    )
    done = subprocess.run(["sh", "-c", f"umask 000 && {script}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    written = list((tmp_path / "run").rglob("*"))
    assert any(p.name == "last.pt" for p in written) and any(p.name == "toy.de" for p in written)
    writable = [p for p in written if os.stat(p).st_mode & stat.S_IWOTH]
    assert not writable


def test_evaluating_a_split_the_prepared_data_lacks_names_it(tiny_checkpoint, tmp_path):
    """Prepared data without a test split (no corpus names one): --split test says so."""
    prepared = tmp_path / "run" / "prepared"
    shutil.copytree(tiny_checkpoint.parent.parent / "prepared", prepared)
    manifest = json.loads((prepared / "manifest.json").read_text())
    del manifest["splits"]["test"]
    (prepared / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(prepared / "test")
    args = ["evaluate", "--checkpoint", tiny_checkpoint, "--set", f"run_dir={tmp_path / 'run'}"]
    assert_one_line_error(invoke(*args, "--split", "test"), "has no test split")
    scored = invoke(*args, "--split", "valid", "--beam", 1, "--json")
    assert scored.exit_code == 0, scored.output
    assert 0 <= json.loads(scored.stdout)["bleu"] <= 100
