"""`mtx bench train` (benchmarks/train.py), the FLOPs it counts, the harness every benchmark
uses (benchmarks/harness.py), and the race against torch's nn.Transformer."""

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import MULTI30K, run_config, tiny_model_config
from helpers.common import invoke
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.reference import Reference
from mtx.bench import harness
from mtx.bench.train import batch_flops, joined_lengths, synthetic_batches, timed_updates
from mtx.config import ATTENTION_SCORES, Config
from mtx.data import toy
from mtx.data.batching import collate
from mtx.errors import MtxError
from mtx.model.build import make_model
from mtx.model.flops import forward_flops
from mtx.model.transformer import Transformer, count_parameters

ROOT = Path(__file__).resolve().parents[1]
MULTI30K_LINES = (MULTI30K / "test2016.en").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("positions", ["sinusoidal", "relative"])
@pytest.mark.parametrize("src_len,tgt_len", [(7, 7), (5, 11)])
def test_forward_flops_equal_what_torch_counts(src_len, tgt_len, positions):
    """The architecture's FLOPs formula against torch's FLOP counter on a real forward pass."""
    cfg = tiny_model_config(d_model=64, d_ff=96, encoder_layers=2, decoder_layers=3)
    cfg.positions, cfg.max_relative_position = positions, 3
    model = Transformer(cfg, vocab_size=70).eval()
    # 4 sentences: at least 16 rows in every product (fewer are padded, see model/rows.py)
    src, tgt = torch.randint(4, 70, (4, src_len)), torch.randint(4, 70, (4, tgt_len))
    # the math kernel runs attention as matrix products, which the counter sees
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(src, tgt)
    assert counter.get_total_flops() == 4 * forward_flops(cfg, 70, src_len, tgt_len)


def test_a_students_forward_flops_equal_what_torch_counts():
    """An SSRU decoder with a narrow feed-forward layer (model/ssru.py)."""
    cfg = tiny_model_config(d_model=64, d_ff=96, encoder_layers=3, decoder_layers=1,
                            decoder_d_ff=40, decoder_self="ssru")  # fmt: skip
    model = Transformer(cfg, vocab_size=70).eval()
    src, tgt = torch.randint(4, 70, (4, 7)), torch.randint(4, 70, (4, 6))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(src, tgt)
    assert counter.get_total_flops() == 4 * forward_flops(cfg, 70, 7, 6)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("score", ATTENTION_SCORES)
def test_rnn_forward_flops_equal_what_torch_counts(cell, score):
    cfg = tiny_model_config(arch="rnn", rnn_cell=cell, attention=score, max_positions=16)
    model = make_model(cfg, vocab_size=70).eval()
    src, tgt = torch.randint(4, 70, (16, 7)), torch.randint(4, 70, (16, 5))  # 16 rows a step
    with FlopCounterMode(display=False) as counter:
        model(src, tgt)
    assert counter.get_total_flops() == 16 * forward_flops(cfg, 70, 7, 5)


def test_batch_flops_use_each_pairs_real_lengths():
    cfg = Config()
    cfg.model = tiny_model_config()
    batches = synthetic_batches(cfg, 50, count=2, length=10)
    for b in batches:
        pairs = zip((b.src != 0).sum(1).tolist(), (b.tgt_out != 0).sum(1).tolist())
        want = sum(3 * forward_flops(cfg.model, 50, s, t) for s, t in pairs)
        assert batch_flops(b, cfg, 50) == want
        assert (b.src != 0).sum(1).min() >= 5  # lengths spread around the mean of 10


def bench(*args):
    result = invoke("bench", *args)
    return result.exit_code, result.output


def test_bench_reports_throughput_flops_mfu_and_memory(tmp_path, prepared):
    cfg = run_config(tmp_path / "r", prepared)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    code, out = bench("--config", config, "--steps", 3, "--warmup", 1, "--json", "--peak-tflops", 2)
    assert code == 0, out
    r = json.loads(out)
    assert r["data"] == str(tmp_path / "r" / "prepared")
    assert r["tokens_per_s"] > r["tgt_tokens_per_s"] > 0
    assert r["mfu"] == pytest.approx(r["tflops"] / 2)
    assert r["tflops"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e12)
    assert r["peak_memory_bytes"] > 10 * 2**20 and 0 <= r["padding"] < 1
    assert r["peak_memory_kind"] == "process peak PSS"
    # the harness's result: the machine and the commit; `mtx bench train` is the same command
    assert r["benchmark"] == "train" and r["machine"]["cores"] >= 1 and "commit" in r
    args = ("--steps", 2, "--warmup", 1, "--repeats", 3, "--json")
    code, out = bench("train", "--config", config, *args)
    assert code == 0, out
    again = json.loads(out)
    assert again["timing"]["repeats"] == 3 and again["seconds"] == again["timing"]["median_s"]
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
    # bf16 autocast (the GPU default) runs through the same step; on CPU too
    code, out = bench(
        "--config",
        config,
        "--set",
        "train.precision=bf16",
        "--synthetic",
        "--steps",
        1,
        "--warmup",
        0,
        "--json",
    )
    assert code == 0, out
    assert json.loads(out)["precision"] == "bf16"
    # the recurrent baseline, its FLOPs from its own formula
    code, out = bench("--config", config, "--set", "model.arch=rnn", "--steps", 1, "--json")
    assert code == 0, out
    r = json.loads(out)
    rnn = Config(model=tiny_model_config(d_model=32, encoder_layers=1, decoder_layers=1))
    rnn.model.arch = "rnn"
    assert r["parameters"] == count_parameters(make_model(rnn.model, 200))
    assert r["tflops"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e12)
    code, out = bench("--config", config, "--set", f"run_dir={tmp_path / 'empty'}")
    assert code == 2 and out.strip().splitlines() == [
        f"mtx: error: no prepared data in {tmp_path / 'empty' / 'prepared'}: run `mtx prepare` "
        "with this config first"
    ]


def test_the_nn_transformer_reference_computes_the_same_function_as_mtx():
    """benchmarks/reference.py races mtx against torch's modules: with mtx's weights copied
    in, the reference gives the same logits, so the race compares equal models."""
    cfg = tiny_model_config(encoder_layers=2, decoder_layers=2)
    torch.manual_seed(0)
    ours, ref = Transformer(cfg, 60).eval(), Reference(cfg, 60).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "norm" in name:  # trained-looking LayerNorms: an extra norm would show
                p.copy_(torch.randn_like(p))
        ref.embed.weight.copy_(ours.embed.weight)
        pairs = [
            (r.self_attn, o.self_attn)
            for r, o in zip(ref.transformer.encoder.layers, ours.encoder_layers)
        ]
        pairs += [
            (r.self_attn, o.self_attn)
            for r, o in zip(ref.transformer.decoder.layers, ours.decoder_layers)
        ]
        pairs += [
            (r.multihead_attn, o.cross_attn)
            for r, o in zip(ref.transformer.decoder.layers, ours.decoder_layers)
        ]
        for r, o in pairs:
            r.in_proj_weight.copy_(o.in_proj.weight)
            r.in_proj_bias.copy_(o.in_proj.bias)
            r.out_proj.load_state_dict(o.out_proj.state_dict())
        for r, o in zip(
            [*ref.transformer.encoder.layers, *ref.transformer.decoder.layers],
            [*ours.encoder_layers, *ours.decoder_layers],
        ):
            r.linear1.load_state_dict(o.ffn.fc1.state_dict())
            r.linear2.load_state_dict(o.ffn.fc2.state_dict())
            r.norm1.load_state_dict(o.self_attn_norm.state_dict())
            last = o.ffn_norm
            if hasattr(o, "cross_attn_norm"):
                r.norm2.load_state_dict(o.cross_attn_norm.state_dict())
                r.norm3.load_state_dict(last.state_dict())
            else:
                r.norm2.load_state_dict(last.state_dict())
    batch = collate([[5, 6, 7, 3], [8, 3]], [[9, 10, 11, 12, 3], [13, 3]])
    keep = batch.tgt_out != 0
    want = ours(batch.src, batch.tgt_in)[keep]
    got = ref(batch.src, batch.tgt_in)[keep]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # a benchmark's own run
def test_bench_reference_script_runs_and_reports_the_ratio(tmp_path, prepared):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config(tmp_path / "r", prepared).to_dict()))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.reference",
            "--config",
            config,
            "--steps",
            "2",
            "--rounds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    ratios = re.findall(r"mtx is (\d+\.\d\d)x", out.stdout)
    assert len(ratios) == 3 and ratios[0] == "1.00"
    assert out.stdout.count("round ") == 2


def test_the_warm_up_cycles_through_the_timed_updates():
    """Work done once per batch shape must be over before the clock starts: every update the
    warm-up runs is one of the timed ones, and with warm-up >= steps each timed one is seen;
    updates are numbered on from 1, and each repeat runs every timed update once; every
    update's loss per target token comes back, in order."""
    seen = []

    class Step:  # what timed_updates calls, recording instead of training
        precision = types.SimpleNamespace(device=torch.device("cpu"))

        def __call__(self, group, number):
            seen.append((number, [id(b) for b in group]))
            return types.SimpleNamespace(loss=torch.tensor(float(number)), tgt_tokens=4)

    updates = [[{}, {}] for _ in range(3)]  # 3 updates of 2 distinct batches
    timing, warmup_seconds, compiles, losses = timed_updates(Step(), updates, warmup=4, repeats=2)
    assert losses == [n / 4 for n in range(1, 11)]
    warm, timed = seen[:4], seen[4:]
    assert [n for n, _ in seen] == list(range(1, 11))
    assert [g for _, g in warm] == [[id(b) for b in u] for u in updates + updates[:1]]
    assert [g for _, g in timed] == [[id(b) for b in u] for u in updates * 2]
    assert len(timing.seconds) == 2 and warmup_seconds >= 0
    assert compiles["timed_compilations"] == 0


def test_the_harness_times_repeats_after_the_warm_up_and_measures_a_process_tree():
    calls = []
    timing, last = harness.timed(lambda: calls.append(len(calls)) or len(calls), 3, 2)
    assert calls == [0, 1, 2, 3, 4] and last == 5 and len(timing.seconds) == 3
    assert timing.best <= timing.median and timing.spread >= 0
    assert timing.as_dict()["repeats"] == 3
    # a child that holds 200 MB is part of the tree's memory, its parent's alone is not
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time; b = bytearray(200 << 20); print(1, flush=True); "
                              "time.sleep(60)"], stdout=subprocess.PIPE)  # fmt: skip
    try:
        child.stdout.readline()
        with harness.PeakMemory(os.getpid(), every=0.05) as peak:
            pass
        assert child.pid in harness.tree(os.getpid())
        assert peak.peak.pss >= harness.memory([child.pid]).pss >= 200 << 20
        assert harness.memory([child.pid]).anon >= 200 << 20
    finally:
        child.kill()
        child.wait()
    m = harness.machine()
    assert m["cores"] >= 1 and m["capability"] == torch.backends.cpu.get_cpu_capability()
    assert m["torch"] == torch.__version__
    assert harness.result("x", {"a": 1}, b=2) | {"date": 0} == {
        "benchmark": "x", "machine": m, "commit": harness.commit(), "date": 0,
        "settings": {"b": 2}, "a": 1,
    }  # fmt: skip


@pytest.mark.slow  # a benchmark's own run
def test_bench_takes_real_lengths_joined_and_compiles_nothing_while_timed(tmp_path, prepared):
    """--lengths-from: random ids with the lengths of a prepared split's pairs, --join 2-4
    joined at random (WMT-like lengths from a corpus of short sentences); with train.compile,
    the warm-up compiles and the timed updates compile nothing."""
    cfg = run_config(tmp_path / "r", prepared)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    train = prepared / "train"
    args = ["--config", config, "--set", "run_dir=/nonexistent", "--lengths-from", train]
    code, out = bench(*args, "--steps", 2, "--warmup", 1, "--json")
    assert code == 0, out
    single = json.loads(out)
    assert single["data"] == f"random ids, lengths of {train}" and not single["compile"]
    code, out = bench(*args, "--join", "2-4", "--set", "train.compile=true", "--set",
                      "train.compile_backend=eager", "--steps", 2, "--warmup", 2, "--json")  # fmt: skip
    assert code == 0, out
    joined = json.loads(out)
    assert joined["data"].endswith("joined 2 to 4 at a time") and joined["compile"]
    assert joined["tokens_per_update"] > single["tokens_per_update"]  # longer pairs, fuller
    assert joined["compilations"] >= 1 and joined["timed_compilations"] == 0
    code, out = bench(*args, "--join", "4-2")
    assert code == 2 and "--join expects N-M with 1 <= N <= M, got '4-2'" in out
    code, out = bench("--config", config, "--lengths-from", tmp_path)
    assert code == 2 and "not a prepared split directory" in out


def test_joined_lengths_add_up_pairs_with_one_eos_each():
    src, tgt = np.array([5, 9, 3]), np.array([4, 2, 7])  # each counts its EOS
    s, t = joined_lengths(src, tgt, (2, 3), cap=1000, n=500, seed=0)
    assert len(s) == 500 and s.min() >= 2 * 3 - 1 and s.max() <= 3 * 9 - 2
    assert t.min() >= 2 * 2 - 1 and t.max() <= 3 * 7 - 2
    s, t = joined_lengths(src, tgt, (2, 2), cap=12, n=50, seed=0)
    assert s.max() <= 12 and t.max() <= 12  # longer ones left out
    with pytest.raises(MtxError, match="too few joined pairs fit 12 tokens"):
        joined_lengths(src, tgt, (3, 3), cap=12, n=50, seed=0)  # none fits


@pytest.mark.slow
def test_the_serving_and_preparing_benchmarks_run_through_mtx_bench(multi30k_run, tmp_path):
    """`mtx bench serve` (a real server on 127.0.0.1, a few bounded requests) and `mtx bench
    prepare` (a small corpus) run and write the harness's JSON result."""
    src = tmp_path / "src.en"
    src.write_text("".join(line + "\n" for line in MULTI30K_LINES[:12]), encoding="utf-8")
    serve = [sys.executable, "-m", "mtx", "bench", "serve", "--checkpoint",
             str(multi30k_run / "checkpoints" / "best.pt"), "--src", str(src), "--clients", "2",
             "--requests", "6", "--seconds", "20", "--modes", "batched",
             "--json", str(tmp_path / "serve.json")]  # fmt: skip
    done = subprocess.run(serve, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "serve.json").read_text())
    assert report["benchmark"] == "serve" and report["same_as_cli"]["batched"] == 1.0
    assert report["batched"][0]["requests"] == 6 and report["batched"][0]["errors"] == 0
    prepare = [sys.executable, "-m", "mtx", "bench", "prepare", "--pairs", "3000", "--workers",
               "1,2", "--work", str(tmp_path / "prep"), "--json", str(tmp_path / "prep.json"),
               "--data", str(MULTI30K),
               "--set", "data.clean.langid=0"]  # fmt: skip
    done = subprocess.run(prepare, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((tmp_path / "prep.json").read_text())["runs"]
    assert [r["workers"] for r in runs] == ["1", "2"] and runs[0]["train_pairs"] > 2900
    assert runs[0]["data_sha256"] == runs[1]["data_sha256"]  # any worker count, same data
    assert all(r["peak_pss_bytes"] > r["peak_pss_anon_bytes"] > 0 for r in runs)


@pytest.mark.parametrize(
    "name", ["train", "decode", "score", "corpus", "serve", "prepare", "clean"]
)
def test_every_bench_command_is_a_typer_command_with_the_same_help(name):
    """`mtx bench X --help` looks and behaves alike for every benchmark: Typer's usage line and
    options table; a flag it does not know is refused in one usage error, before any work."""
    result = invoke("bench", name, "--help")
    assert result.exit_code == 0, result.output
    assert re.search(rf"Usage: \S+ bench {name} \[OPTIONS\]", " ".join(result.output.split()))
    assert "--help" in result.output and "Options" in result.output
    refused = invoke("bench", name, "--no-such-flag")
    assert refused.exit_code == 2 and "No such option: --no-such-flag" in refused.output


@pytest.mark.slow
def test_the_corpus_benchmark_compares_two_processes_with_one_and_a_killed_job(toy_run, tmp_path):
    """`mtx bench corpus`: one process and two under torchrun, then two with rank 1 killed and
    restarted, each output byte-identical to one process's."""
    src = tmp_path / "src.en"
    src.write_text("".join(s + "\n" for s, _ in toy.split_pairs("train")[:400]))
    bench = [sys.executable, "-m", "mtx", "bench", "corpus", "--checkpoint",
             str(toy_run / "checkpoints" / "best.pt"), "--src", str(src), "--tgt", str(src),
             "--jobs", "translate", "--rounds", "1", "--kill", "--work", str(tmp_path / "w"),
             "--json"]  # fmt: skip
    done = subprocess.run(bench, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = json.loads(done.stdout)["jobs"]
    assert list(jobs)[:2] == ["translate, 1 process", "translate, 2 processes"]
    assert all(f["same"] for f in jobs.values())
    # the restarted attempt may find nothing left to do (then no rate of its own)
    assert all(f["working_per_s"] > 0 for f in list(jobs.values())[:2])
    assert len(jobs) == 3 and "killed" in list(jobs.values())[2]  # the kill's run, whether or
    # not it came before rank 1 ran out of chunks (a benchmark, not a test of the restart)


def test_mtx_bench_refuses_bad_lists_in_one_line(tmp_path):
    args = ["--checkpoint", tmp_path / "x.pt", "--src", tmp_path / "x.en"]
    result = invoke("bench", "serve", *args, "--clients", "1,four")
    assert result.exit_code == 2 and "--clients expects positive numbers" in result.output
    result = invoke("bench", "corpus", *args, "--processes", "1,0")
    assert result.exit_code == 2 and "--processes expects positive numbers" in result.output
    result = invoke("bench", "prepare", "--data", tmp_path, "--work", tmp_path / "w")
    assert result.exit_code == 2 and f"--data: no such file: {tmp_path}/train.en" in result.output
