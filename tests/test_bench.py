"""`mtx bench` and the FLOPs it counts."""

import json

import pytest
import torch
import yaml
from conftest import run_config, tiny_model_config
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from mtx.bench import batch_flops, synthetic_batches
from mtx.cli import app
from mtx.config import Config
from mtx.model.flops import forward_flops
from mtx.model.transformer import Transformer

runner = CliRunner()


@pytest.mark.parametrize("src_len,tgt_len", [(7, 7), (5, 11)])
def test_forward_flops_equal_what_torch_counts(src_len, tgt_len):
    """The architecture's FLOPs formula against torch's FLOP counter on a real forward pass."""
    cfg = tiny_model_config(d_model=64, d_ff=96, encoder_layers=2, decoder_layers=3)
    model = Transformer(cfg, vocab_size=70).eval()
    src, tgt = torch.randint(4, 70, (3, src_len)), torch.randint(4, 70, (3, tgt_len))
    # the math kernel runs attention as matrix products, which the counter sees
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(src, tgt)
    assert counter.get_total_flops() == 3 * forward_flops(cfg, 70, src_len, tgt_len)


def test_batch_flops_use_each_pairs_real_lengths():
    cfg = Config()
    cfg.model = tiny_model_config()
    batches = synthetic_batches(cfg, 50, count=2, length=10)
    for b in batches:
        pairs = zip((b["src"] != 0).sum(1).tolist(), (b["tgt_out"] != 0).sum(1).tolist())
        want = sum(3 * forward_flops(cfg.model, 50, s, t) for s, t in pairs)
        assert batch_flops(b, cfg, 50) == want
        assert (b["src"] != 0).sum(1).min() >= 5  # lengths spread around the mean of 10


def bench(*args):
    result = runner.invoke(app, ["bench", *map(str, args)])
    return result.exit_code, result.output


def test_bench_reports_throughput_flops_mfu_and_memory(tmp_path, prepared):
    cfg = run_config(tmp_path / "r", prepared)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    code, out = bench("--config", config, "--steps", 3, "--warmup", 1, "--json", "--peak-tflops", 2)
    assert code == 0, out
    r = json.loads(out)
    assert r["data"] == str(prepared.parent / "prepared") or r["data"].endswith("prepared")
    assert r["tokens_per_s"] > r["tgt_tokens_per_s"] > 0
    assert r["mfu"] == pytest.approx(r["tflops"] / 2)
    assert r["tflops"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e12)
    assert r["peak_memory_bytes"] > 10 * 2**20 and 0 <= r["padding"] < 1
    # synthetic batches need no prepared data; without a known peak there is no MFU
    code, out = bench(
        "--config",
        config,
        "--set",
        "run_dir=/nonexistent",
        "--synthetic",
        "--steps",
        2,
        "--warmup",
        0,
    )
    assert code == 0, out
    assert "tokens/s" in out and "MFU                n/a" in out
    code, out = bench("--config", config, "--set", f"run_dir={tmp_path / 'empty'}")
    assert code == 2 and out.strip().splitlines() == [
        f"mtx: error: no prepared data in {tmp_path / 'empty' / 'prepared'}: run `mtx prepare` "
        "with this config first"
    ]
