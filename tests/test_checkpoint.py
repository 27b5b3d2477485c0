"""Checkpoint averaging (`mtx average`) and what a checkpoint says about itself."""

import json

import torch
from typer.testing import CliRunner

from mtx import checkpoint
from mtx.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_averaging_the_last_checkpoints_gives_their_mean(toy_run, tmp_path):
    out = tmp_path / "avg.pt"
    result = invoke("average", toy_run, "--last", 2, "--output", out)
    assert result.exit_code == 0, result.output
    avg = checkpoint.load(out)
    a = checkpoint.load(toy_run / "checkpoints" / "step-125.pt")["model"]
    b = checkpoint.load(toy_run / "checkpoints" / "step-250.pt")["model"]
    for name, tensor in avg["model"].items():
        expected = ((a[name].double() + b[name].double()) / 2).float()
        assert torch.equal(tensor, expected), name
    assert not torch.equal(avg["model"]["embed.weight"], b["embed.weight"])
    assert avg["step"] == 250 and "optimizer" not in avg
    assert [s["step"] for s in avg["averaged_from"]] == [250, 125]
    # The same checkpoints named one by one give the same average, and it translates.
    again = tmp_path / "again.pt"
    steps = [toy_run / "checkpoints" / f"step-{n}.pt" for n in (125, 250)]
    assert invoke("average", *steps, "--output", again).exit_code == 0
    assert all(
        torch.equal(x, y)
        for x, y in zip(avg["model"].values(), checkpoint.load(again)["model"].values())
    )
    translated = runner.invoke(app, ["translate", "--checkpoint", str(out)], input="a dog runs.\n")
    assert translated.exit_code == 0 and translated.stdout.strip()


def test_averaging_refuses_what_does_not_fit(toy_run, tmp_path):
    result = invoke("average", toy_run, "--last", 3, "--output", tmp_path / "x.pt")
    assert result.exit_code == 2 and "holds (2;" in result.output
    step = toy_run / "checkpoints" / "step-250.pt"
    result = invoke("average", step, "--output", step)
    assert result.exit_code == 2 and "is one of the checkpoints" in result.output
    other = checkpoint.load(step)
    other["config"]["model"]["d_ff"] = 64
    checkpoint.save(tmp_path / "other.pt", other)
    result = invoke("average", step, tmp_path / "other.pt", "--output", tmp_path / "x.pt")
    assert result.exit_code == 2 and "another model" in result.output
    assert not (tmp_path / "x.pt").exists()


def test_a_checkpoint_carries_its_data_manifest_and_version(toy_run):
    ckpt = checkpoint.load(toy_run / "checkpoints" / "best.pt")
    manifest = json.loads((toy_run / "prepared" / "manifest.json").read_text())
    assert ckpt["manifest"] == manifest
    assert manifest["splits"]["train"]["source"] == "toy:train"
    assert len(manifest["splits"]["train"]["pairs_sha256"]) == 64
    assert (
        ckpt["mtx_version"] and ckpt["spm_model"] == (toy_run / "prepared/spm.model").read_bytes()
    )
    info = runner.invoke(app, ["info", str(toy_run / "checkpoints" / "best.pt")])
    assert "data: train toy:train" in info.stdout, info.stdout
