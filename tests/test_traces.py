"""benchmarks/traces.py on a hand-made trace: the GPU's gaps, the compiled graphs' host time,
and copies by the operators that launched them."""

import gzip
import json

import pytest

from benchmarks import traces


def event(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_a_trace_says_where_the_gpu_waits_and_who_launched_the_copies(tmp_path):
    events = [
        event("cpu_op", "## Call CompiledFxGraph fwd ##", 0, 40),
        event("cpu_op", "TorchDynamo Cache Lookup", 0, 2),
        event("cpu_op", "aten::to", 10, 5),
        event("cpu_op", "aten::copy_", 11, 3),
        event("cuda_runtime", "cudaLaunchKernel", 12, 1, correlation=7),
        event("cuda_runtime", "cudaLaunchKernel", 30, 1, correlation=8),
        event("kernel", "triton_poi_fused_add_0", 20, 10, tid=9, correlation=8),
        event("kernel", "void at::native::bfloat16_copy_kernel_cuda", 35, 5, tid=9, correlation=7),
        event("kernel", "nvjet_sm90_gemm", 38, 2, tid=9),  # overlaps: no gap
        event("gpu_memcpy", "Memcpy HtoD", 50, 10, tid=9),
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events + [{"ph": "i", "name": "marker"}]}, f)
    out = traces.summary(path, updates=2)
    assert out["span_ms_per_update"] == pytest.approx(40 / 1e3 / 2)
    assert out["idle_ms_per_update"] == pytest.approx((5 + 10) / 1e3 / 2)  # 30..35, 40..50
    assert [g["us"] for g in out["largest_gaps"]] == [10, 5]
    assert out["largest_gaps"][0]["previous"] == "nvjet_sm90_gemm"
    assert out["host_regions"]["## Call CompiledFxGraph fwd ##"] == {
        "calls": 1,
        "ms_per_call": 0.04,
    }
    copies = out["copies_ms_per_update"]
    assert copies == {
        "## Call CompiledFxGraph fwd ## > aten::to > aten::copy_": pytest.approx(5 / 1e3 / 2)
    }
