"""What `pip install .` installs: the package mtx alone (its benchmarks inside it), no other
top-level name; the investigations of benchmarks/ stay in the checkout."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_make_install_is_quiet(tmp_path):
    """`make install` in a copy of the checkout (a new .venv, torch from this environment's
    wheel cache or index): no warning box from the build (setuptools' deprecations, its
    editable-install notice), only pip's own lines about its indexes."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    done = subprocess.run(
        ["make", "install"], cwd=tmp_path, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = [
        x
        for x in (done.stdout + done.stderr).splitlines()
        if "Location 'file:" not in x and "PYTHONWARNINGS=" not in x  # make's echo of it
    ]
    assert not any("deprecated" in x or "Editable installation" in x for x in said), said
