"""Batch independence under every CPU capability this machine has.

ATen picks its kernels once, when torch loads: vector loops of 16 floats (AVX-512), 8 (AVX2)
or plain C++ (default), overridable with ATEN_CPU_CAPABILITY. A sentence must get the same
translation, bit for bit, alone or in any batch, whichever kernels run. Each capability is
checked in a process of its own (tests/helpers/capability_check.py: the operations of the
decoding path, then every architecture's beam and greedy search with torch's, packed fp32 and
int8 products). A capability this CPU lacks cannot be run here (its instructions would
crash the process): that test is skipped and says so. The fast suite checks the kernels this
CPU runs unasked (its best: what `mtx translate` runs there); the others (the portable
`default` kernels, AVX2 on an AVX-512 machine) are checked by `make test-all` (the `slow`
marker), so that the fast suite runs one full kernel set, not two.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELPER = Path(__file__).parent / "helpers" / "capability_check.py"
ROOT = Path(__file__).parent.parent
CAPABILITIES = ("default", "avx2", "avx512")


def supported() -> list[str]:
    """The capabilities up to the best that this CPU has (what ATen picks unasked)."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    return list(CAPABILITIES[: CAPABILITIES.index(best) + 1]) if best in CAPABILITIES else []


def best() -> str:
    """The kernels this CPU picks unasked: the default run's one representative."""
    return torch.backends.cpu.get_cpu_capability().lower()


@pytest.mark.parametrize(
    "capability",
    [c if c == best() else pytest.param(c, marks=pytest.mark.slow) for c in CAPABILITIES],
)
def test_a_sentence_gets_the_same_hypotheses_in_any_batch_under_each_capability(capability):
    if capability not in supported():
        pytest.skip(
            f"this CPU runs ATen's {torch.backends.cpu.get_cpu_capability()} kernels at best: "
            f"{capability} cannot be checked here"
        )
    env = os.environ | {"ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(HELPER)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["capability"].lower() == capability  # the kernels asked for ran
    assert report["operations"] == [], "operations that depend on the batch"
    assert report["searches"] == [], "searches that depend on the batch"
    assert report["checked"] >= 16 * 2 * 7  # architectures x searches x batchings, each kind
