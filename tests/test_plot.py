"""`mtx plot` (training curves) and `mtx translate --attention-dir` (attention heatmaps)."""

import json

import matplotlib.image
import pytest
import torch
from helpers.common import invoke
from helpers.translating import outputs

from mtx.data import toy
from mtx.decode.translator import Translator


def write_metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_draws_one_panel_per_logged_curve(tmp_path):
    rows = []
    for step in range(10, 110, 10):
        rows.append(
            {"kind": "train", "step": step, "loss": 9 / step, "ppl": 2.0, "lr": step * 1e-5,
             "tokens_per_s": 1000.0 + step}
        )  # fmt: skip
        if step % 50 == 0:
            rows.append({"kind": "valid", "step": step, "valid_loss": 1.0, "valid_ppl": 2.7})
    write_metrics(tmp_path / "metrics.jsonl", rows)
    result = invoke("plot", tmp_path)
    assert result.exit_code == 0, result.output
    assert "loss (label-smoothed), perplexity, learning rate, tokens/s" in result.output
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.shape[:2] == (4 * 250, 800)  # 4 panels of 8 x 2.5 inches at 100 dpi
    assert image[..., :3].std() > 0.05  # something is drawn

    rows.append({"kind": "valid", "step": 100, "valid_bleu": 12.5, "valid_chrf": 30.0})
    rows.append({"kind": "train", "step": 110, "grad_norm": 0.7})
    write_metrics(tmp_path / "metrics.jsonl", rows)
    result = invoke("plot", tmp_path, "--output", tmp_path / "sub" / "x.png")
    assert result.exit_code == 0 and "BLEU and chrF" in result.output
    assert "gradient norm" in result.output
    assert matplotlib.image.imread(tmp_path / "sub" / "x.png").shape[:2] == (6 * 250, 800)


def test_plot_refuses_a_bad_metrics_log_and_writes_nothing(tmp_path):
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2 and "no metrics log" in result.output
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 2}\n{oops\n')
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2
    assert f"{tmp_path / 'metrics.jsonl'}:2: not a JSON line" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


@pytest.fixture(scope="module")
def lines():
    return [src for src, _ in toy.split_pairs("test")[:3]]


def test_attention_dir_writes_a_heatmap_and_the_weights_the_model_returned(
    toy_run, lines, tmp_path
):
    best = toy_run / "checkpoints" / "best.pt"
    out = tmp_path / "att"
    result = invoke(
        "translate", "--checkpoint", best, "--attention-dir", out, input="\n".join(lines) + "\n"
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        f"00000{i}.{ext}" for i in (1, 2, 3) for ext in ("json", "png")
    ]
    tr = Translator.from_checkpoints(best)
    for number, (line, hyps) in enumerate(zip(lines, outputs(tr, lines)), 1):
        about = json.loads((out / f"{number:06d}.json").read_text())
        record = tr.translate([line], tr.options(attention=True))[0].attention
        want = record.weights.mean(dim=(0, 1))  # (outputs, sources)
        got = torch.tensor(about["attention"])
        assert about["source"] == record.source and about["output"] == record.output
        assert got.shape == (len(hyps[0].tokens) + 1, len(tr.parts.codec.encode(line)))
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(got.sum(1), torch.ones(len(got)))
        assert about["alignment"] == want.argmax(1).tolist()
        assert about["source"][-1] == about["output"][-1] == "</s>"
        image = matplotlib.image.imread(out / f"{number:06d}.png")
        rows, cols = len(about["output"]), len(about["source"])
        size = (100 + 40 * max(rows, 4), 100 + 40 * max(cols, 4))  # (1 + 0.4 n) inches, 100 dpi
        assert image.shape[:2] == size


def test_attention_of_every_layer_and_head(toy_run, lines, tmp_path):
    best = toy_run / "checkpoints" / "best.pt"
    out = tmp_path / "att"
    result = invoke(
        "translate", "--checkpoint", best, "--attention-dir", out, "--every-head", input=lines[0]
    )
    assert result.exit_code == 0, result.output
    tr = Translator.from_checkpoints(best)
    L, H = tr.parts.model.cfg.decoder_layers, tr.parts.model.cfg.n_heads
    names = {p.name for p in out.iterdir()}
    assert len(names) == 2 + L + L * H
    assert f"000001.layer{L}.head{H}.png" in names
    about = json.loads((out / "000001.json").read_text())
    weights = torch.tensor(about["weights"])
    assert weights.shape[:2] == (L, H)
    torch.testing.assert_close(weights.mean(dim=(0, 1)), torch.tensor(about["attention"]))


def test_every_head_needs_an_attention_dir(toy_run):
    result = invoke(
        "translate", "--checkpoint", toy_run / "checkpoints" / "best.pt", "--every-head"
    )
    assert result.exit_code == 2 and "--every-head needs --attention-dir" in result.output
