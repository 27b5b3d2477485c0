"""benchmarks/gpu_report.py, the one command for a lent GPU, run with --smoke: every part on
the CPU with tiny sizes, so that the report works when a GPU session comes."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_parts
from benchmarks import gpu_report as report
from benchmarks.gpu_report import agreement, reference_of

ROOT = Path(__file__).parent.parent


# slow: every part and variant on the CPU (80 s); run it (make test-all) before a GPU session
@pytest.mark.slow
def test_the_gpu_report_runs_every_part_and_writes_its_table(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_report", "--smoke", "--out",
         str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--budget", "900", "--trace"],
        capture_output=True, text=True, timeout=1000,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    parts = report["parts"]
    assert list(parts) == ["prepare", "bench", "train", "decode", "fp16", "nccl", "oom", "profile"]
    failed = {name: part["error"][-500:] for name, part in parts.items() if "error" in part}
    assert failed == {}
    bench = {k: v for k, v in parts["bench"].items() if k != "part_seconds"}
    assert list(bench) == [f"base {name}" for name in gpu_parts.VARIANTS]
    assert bench["base eager"]["tokens_per_s"] > 0 and not bench["base eager"]["compile"]
    for name, r in bench.items():
        assert r["tokens_per_s"] > 0 and r["vs_eager"] > 0, name
        assert r["compile"] == ("compiled" in name) and r.get("timed_compilations", 0) == 0
    assert bench["base bf16-weights"]["precision"] == "bf16-weights"
    for name, r in bench.items():  # every update's loss, warm-up included, for the loss check
        assert len(r["losses"]) == 2 * 3 and all(math.isfinite(x) for x in r["losses"]), name
    for name in ("compiled", "compiled+graphs"):  # traced, torch's kernels: the same losses
        ref = bench[reference_of(f"base {name}")]
        assert agreement(bench[f"base {name}"]["losses"], ref["losses"])["max_rel"] < 1e-4
    assert reference_of("base compiled+graphs") == "base static"
    profiles = {k: v for k, v in parts["profile"].items() if k != "part_seconds"}
    assert list(profiles) == ["base eager", "base compiled", "base bf16-weights"]
    for name, p in profiles.items():  # by kind: the whole of the kernels' time, split
        assert p["top"] and math.isclose(sum(p["kinds_ms_per_update"].values()),
                                         p["kernel_ms_per_update"], rel_tol=1e-6), name  # fmt: skip
        assert (tmp_path / "work" / "traces" / f"{name.replace(' ', '-')}.json.gz").is_file()
    assert profiles["base compiled"]["compilations"] > 0 == profiles["base eager"]["compilations"]
    assert profiles["base bf16-weights"]["compilations"] == 0
    assert (tmp_path / "work" / "parts" / "profile.log").is_file()
    train = parts["train"]
    assert train["steps"] == 8 and train["logged_tokens_per_s"] > 0 and 0 <= train["test"]["bleu"]
    decode = {k: v for k, v in parts["decode"].items() if k != "part_seconds"}
    assert len(decode) == 8 and all(v["tgt_tokens_per_s"] > 0 for v in decode.values())
    assert [v["same_as_smallest_batch"] for v in decode.values()] == [None, 1.0] * 4
    static = [v["same_as_shrinking"] for k, v in decode.items() if k.endswith("static")]
    assert len(static) == 4 and all(same > 0.9 for same in static)  # near-ties may tip
    fp16 = parts["fp16"]
    assert fp16["steps"] == 8 and all(math.isfinite(x) for x in fp16["losses"])
    assert fp16["loss_scale"] > 0
    nccl = parts["nccl"]  # on the CPU: gloo, in a process group of one
    assert (nccl["exit"], nccl["backend"], nccl["last_step"]) == (0, "gloo", 8)
    assert len(parts["oom"]["oom_records"]) == 1 and parts["oom"]["last_step"] == 8
    table = (tmp_path / "out" / "report.md").read_text()
    assert table == out.stdout[out.stdout.index("environment:") :]
    assert table.count("\n| ") == 25 and "failed" not in table
    assert table.count("loss vs eager over 6 updates") == 4  # the compiled and bf16 ones
    assert table.count("loss vs static over 6 updates") == 2  # the graphs variants


def test_each_part_leaves_the_later_parts_the_least_they_need():
    args = report.arguments(["--out", "x", "--minutes", "3"])
    now = time.time()
    most, least = report.limits(args, "bench", ["train", "decode"], now + 530)
    assert least == report.LEAST["bench"]
    assert abs(most - (530 - (180 + 60) - report.LEAST["decode"])) < 2  # train: 3 min + 60 s
    most, _ = report.limits(args, "prepare", [], now + 1000)
    assert most == report.LIMITS["prepare"]  # its own limit when time is plenty
    most, least = report.limits(args, "oom", ["profile"], now + 40)
    assert most < least  # 40 s left, the profile needs 45: the oom part is skipped
    args = report.arguments(["--out", "x", "--limit", "decode=150"])
    assert report.limits(args, "decode", ["bench"], now + 1000)[0] == 150  # its own, given


def test_an_unknown_variant_is_refused_in_one_line(tmp_path):
    for flag in ("--variants", "--train-variant"):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.gpu_report", "--smoke", "--out", str(tmp_path),
             flag, "eager,fast" if flag == "--variants" else "fast"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode != 0
        assert (
            out.stderr.strip()
            .splitlines()[-1]
            .startswith(
                "--variants/--train-variant: unknown fast; variants: eager, static, compiled"
            )
        )
        assert not (tmp_path / "report.json").exists()


def test_kernels_are_told_apart_by_what_they_compute():
    kind = gpu_parts.kernel_kind
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matrix products"
    assert kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT") == "matrix products"
    assert kind("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert kind("fmha_cutlassB_bf16_aligned_64x64_k64_sm80") == "attention"  # not a gemm
    assert kind("triton_red_fused__log_softmax_mean_0") == "generated (triton)"
    assert kind("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert kind("Memcpy HtoD (Pageable -> Device)") == "copies and fills"
    assert kind("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>") == (
        "elementwise and reductions"
    )
    assert kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert kind("void cudnn::bn_fw_tr_1C11_kernel_NCHW") == "other"


def test_a_variant_may_set_environment_variables_beside_its_settings():
    args = report.arguments(["--out", "x", "--smoke"])
    args.work = Path("x")
    sizes = gpu_parts.Sizes(args)
    assert gpu_parts.variant(sizes, "compiled+cpp-wrapper") == ["train.compile=true"]
    assert gpu_parts.variant_env("compiled+cpp-wrapper") == {"TORCHINDUCTOR_CPP_WRAPPER": "1"}
    assert gpu_parts.variant_env("compiled") == {}
