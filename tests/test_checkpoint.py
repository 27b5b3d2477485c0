"""Checkpoints as a type: what they hold, their format version, averaging (`mtx average`),
and the run directory's layout."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from helpers.common import invoke, mtx, records

from mtx import checkpoint
from mtx.checkpoint import Checkpoint, Position, RunDir
from mtx.errors import MtxError

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-format-1.pt"


def test_averaging_the_last_checkpoints_gives_their_mean(toy_run, tmp_path):
    out = tmp_path / "avg.pt"
    mtx("average", toy_run, "--last", 2, "--output", out)
    avg = Checkpoint.load(out)
    run = RunDir(toy_run)
    a, b = Checkpoint.load(run.step(125)).model, Checkpoint.load(run.step(250)).model
    for name, tensor in avg.model.items():
        expected = ((a[name].double() + b[name].double()) / 2).float()
        assert torch.equal(tensor, expected), name
    assert not torch.equal(avg.model["embed.weight"], b["embed.weight"])
    assert avg.step == 250 and avg.resume is None
    assert [s.step for s in avg.averaged_from] == [250, 125]
    # The same checkpoints named one by one give the same average, and it translates.
    again = tmp_path / "again.pt"
    mtx("average", run.step(125), run.step(250), "--output", again)
    assert all(
        torch.equal(x, y) for x, y in zip(avg.model.values(), Checkpoint.load(again).model.values())
    )
    translated = mtx("translate", "--checkpoint", out, input="a dog runs.\n")
    assert translated.stdout.strip()


def test_averaging_refuses_what_does_not_fit(toy_run, tmp_path):
    result = invoke("average", toy_run, "--last", 3, "--output", tmp_path / "x.pt")
    assert result.exit_code == 2 and "holds (2;" in result.output
    step = RunDir(toy_run).step(250)
    result = invoke("average", step, "--output", step)
    assert result.exit_code == 2 and "is one of the checkpoints" in result.output
    other = Checkpoint.load(step)
    other.config.model.d_ff = 64
    other.save(tmp_path / "other.pt")
    result = invoke("average", step, tmp_path / "other.pt", "--output", tmp_path / "x.pt")
    assert result.exit_code == 2 and "another model" in result.output
    assert not (tmp_path / "x.pt").exists()


def test_a_checkpoint_carries_its_data_manifest_and_version(toy_run):
    run = RunDir(toy_run)
    ckpt = Checkpoint.load(run.best)
    manifest = json.loads(run.data.manifest.read_text())
    assert ckpt.manifest.to_dict() == manifest  # the same JSON, through the typed Manifest
    assert manifest["splits"]["train"]["source"] == "toy:train"
    assert len(manifest["splits"]["train"]["pairs_sha256"]) == 64
    assert ckpt.mtx_version and ckpt.spm_model == run.data.spm_model.read_bytes()
    info = invoke("info", run.best)
    assert "data: train toy:train" in info.stdout, info.stdout


def test_saving_and_loading_gives_back_every_field(tmp_path):
    ckpt = Checkpoint.load(FIXTURE)
    ckpt.position = Position(7, 1, 3, 2.5, 11.0, 5, 2)
    ckpt.averaged_from = [checkpoint.Source("a.pt", 3)]
    ckpt.init_from = checkpoint.InitRecord("b.pt", "0" * 64, 9, ["step"])
    ckpt.save(tmp_path / "c.pt")
    again = Checkpoint.load(tmp_path / "c.pt")
    assert again.position == ckpt.position and again.config == ckpt.config
    assert again.averaged_from == ckpt.averaged_from and again.init_from == ckpt.init_from
    assert (again.spm_model, again.vocab_size, again.manifest) == (
        ckpt.spm_model,
        ckpt.vocab_size,
        ckpt.manifest,
    )
    assert all(torch.equal(again.model[k], v) for k, v in ckpt.model.items())
    assert again.resume.optimizer["param_groups"] == ckpt.resume.optimizer["param_groups"]
    assert torch.equal(again.resume.process_rngs[0][0], ckpt.resume.process_rngs[0][0])


def test_a_checkpoint_of_the_first_format_loads_and_resumes(tmp_path):
    """tests/fixtures' checkpoint was written by mtx before checkpoints were a type: it loads
    with every field, translates, and a run resumes from it."""
    ckpt = Checkpoint.load(FIXTURE)
    assert (ckpt.step, ckpt.position.epoch, ckpt.position.batch) == (4, 0, 4)
    assert ckpt.resume is not None and len(ckpt.resume.process_rngs) == 1
    assert ckpt.settings().model.d_model == 16 and ckpt.vocab_size == 100
    assert mtx("translate", "--checkpoint", FIXTURE, input="a dog runs.\n").stdout.count("\n") == 1
    run = RunDir(tmp_path / "run")
    config = tmp_path / "fixture.yaml"
    config.write_text(yaml.safe_dump(ckpt.config.to_dict() | {"run_dir": str(run.root)}))
    sets = ["--set", f"data.spm_model={FIXTURE}", "--set", "train.max_steps=6"]
    mtx("prepare", "--config", config, *sets)
    run.checkpoints.mkdir(parents=True)
    run.last.write_bytes(FIXTURE.read_bytes())
    result = mtx("train", "--config", config, *sets, "--resume")
    assert f"resuming from {run.last} at step 4" in result.output
    resumed = Checkpoint.load(run.last)
    assert resumed.step == 6 and {r["step"] for r in records(run.root, "valid")} == {6}
    assert not torch.equal(resumed.model["embed.weight"], ckpt.model["embed.weight"])


def test_a_guided_model_written_before_align_context_aligns_as_it_was_trained(tmp_path):
    """train.align_context's default is full; a guided checkpoint written before the setting
    existed was trained in the translating pass, and loads as causal. Any other keeps its own."""
    payload = torch.load(FIXTURE, weights_only=True)
    payload["config"]["train"] |= {"align_weight": 0.05}
    payload["config"]["train"].pop("align_context", None)
    torch.save(payload, tmp_path / "older.pt")
    assert Checkpoint.load(tmp_path / "older.pt").config.train.align_context == "causal"
    payload["config"]["train"]["align_context"] = "full"
    torch.save(payload, tmp_path / "newer.pt")
    assert Checkpoint.load(tmp_path / "newer.pt").config.train.align_context == "full"
    payload["config"]["train"] |= {"align_weight": 0.0}
    payload["config"]["train"].pop("align_context")
    torch.save(payload, tmp_path / "plain.pt")
    assert Checkpoint.load(tmp_path / "plain.pt").config.train.align_context == "full"


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path):
    payload = torch.load(FIXTURE, weights_only=True)
    payload["format"] = f"{checkpoint.FORMAT_NAME}-{checkpoint.FORMAT_VERSION + 1}"
    torch.save(payload, tmp_path / "new.pt")
    with pytest.raises(MtxError, match=r"format 2 comes from a newer mtx .* upgrade mtx"):
        Checkpoint.load(tmp_path / "new.pt")
    result = invoke("info", tmp_path / "new.pt")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    torch.save({"format": "something-else", "model": {}}, tmp_path / "other.pt")
    with pytest.raises(MtxError, match="not an mtx checkpoint"):
        Checkpoint.load(tmp_path / "other.pt")
    del payload["model"]
    payload["format"] = "mtx-checkpoint-1"
    torch.save(payload, tmp_path / "part.pt")
    with pytest.raises(MtxError, match=r"part.pt: an incomplete mtx checkpoint \(no model\)"):
        Checkpoint.load(tmp_path / "part.pt")


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/mtx-pwned",))


def test_a_checkpoint_whose_pickle_runs_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "mtx-checkpoint-1", "payload": Boom()}, path)
    if os.path.exists("/tmp/mtx-pwned"):
        os.remove("/tmp/mtx-pwned")
    with pytest.raises(MtxError, match="not a loadable mtx checkpoint"):
        Checkpoint.load(path)
    assert not os.path.exists("/tmp/mtx-pwned")


def test_a_truncated_checkpoint_gives_a_clear_error(tmp_path):
    path = tmp_path / "c.pt"
    Checkpoint.load(FIXTURE).save(path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(MtxError, match="c.pt"):
        Checkpoint.load(path)
    assert oct(path.stat().st_mode & 0o777) != oct(0o777)


def test_the_run_directory_names_its_files(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for n in (5, 40, 300):
        run.step(n).write_bytes(b"")
    (run.checkpoints / "step-x.pt").write_bytes(b"")
    assert [p.name for p in run.steps()] == ["step-300.pt", "step-40.pt", "step-5.pt"]
    run.prune(2)
    assert [p.name for p in run.steps()] == ["step-300.pt", "step-40.pt"]
    assert run.data.split("train") == tmp_path / "prepared" / "train"
    assert (run.last.name, run.best.name, run.metrics.name) == (
        "last.pt",
        "best.pt",
        "metrics.jsonl",
    )
