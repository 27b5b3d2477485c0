"""benchmarks/architectures.py: every variant trained by the same pipeline."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from benchmarks.architectures import VARIANTS, table, write_block


def test_the_table_block_is_replaced_in_place(tmp_path):
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n\nbefore\n")
    row = {
        "variant": "pre", "overrides": ["model.norm=pre"], "bleu": 81.234, "chrf": 90.0,
        "parameters": 1234, "tokens_per_s": 5000.4, "train_seconds": 61.2, "steps": 400,
        "best_step": 300,
    }  # fmt: skip
    write_block(doc, "toy", table([row], "python -m benchmarks.architectures", "cpu2"))
    first = doc.read_text()
    assert "| pre | model.norm=pre | 81.23 | 90.00 | 1,234 | 5,000 | 61 s | 400 (300) |" in first
    write_block(doc, "toy", table([{**row, "bleu": 50.0}], "cmd", "cpu2"))
    second = doc.read_text()
    assert second.count("<!-- compare:toy -->") == 1 and "| 50.00 |" in second
    assert "81.23" not in second and second.startswith("# Benchmarks\n\nbefore\n")


@pytest.mark.slow
def test_every_variant_learns_the_toy_corpus(tmp_path):
    """Each variant reaches sacreBLEU 80 on the toy test split in a short CPU run (the
    settings of the toy table in BENCHMARKS.md; about 50 minutes on 2 cores)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.architectures", "--set",
         "train.max_steps=600", "--set", "train.max_minutes=0", "--set", "train.threads=1",
         "--parallel", "2", "--work", str(tmp_path), "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    results = {r["variant"]: r for r in json.loads(out.stdout.splitlines()[-1])}
    assert set(results) == set(VARIANTS)
    for name, r in results.items():
        assert r["bleu"] >= 80, (name, r["bleu"])
