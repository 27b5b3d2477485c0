"""What `pip install .` installs: the package mtx alone (its benchmarks inside it), no other
top-level name; the investigations of benchmarks/ stay in the checkout."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from mtx import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_mtx_alone_with_the_benchmarks_mtx_bench_runs(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info beside it
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("mtx", "benchmarks"):
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*build, "-w", tmp_path / "dist", source], check=True, capture_output=True, text=True
    )
    assert "deprecated" not in done.stdout + done.stderr  # a quiet install: no warning boxes
    (wheel,) = (tmp_path / "dist").glob("mtx-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"mtx", f"mtx-{__version__}.dist-info"}
    for module in ("harness", "train", "decode", "peers", "serve", "server", "prepare"):
        assert f"mtx/bench/{module}.py" in names
    assert {"mtx/cli/bench.py", "mtx/serve/page.html"} <= names
    assert not any(n.startswith("benchmarks/") for n in names)
