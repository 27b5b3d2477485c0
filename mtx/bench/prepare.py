"""`mtx bench prepare`: `mtx prepare` of a WMT-size corpus, by encoding workers: the seconds
of each stage and the peak memory.

    mtx bench prepare [--pairs 4500000] [--workers 1@1,1,2] [--work /tmp/bench_prepare]
                      [--sample-every 2] [--data data/multi30k]
                      [--config configs/base.yaml] [--set KEY=VALUE ...] [--json FILE]

The corpus is built from Multi30k's training pairs (--data), joining 2 or 3 pairs picked at
random (seed 1) into one, about WMT's sentence lengths (few duplicates); valid and test are
Multi30k's val and test2016. Each `mtx prepare` (--config, by default configs/base.yaml:
vocabulary 37,000, max_len 250; --set over it) runs in its own process, one after the other, with data.workers W ("W"), or W on the
first C cores ("W@C", taskset). The peak memory is the harness's measure, the PSS of the
whole process tree (the main process and its encoding workers), sampled every --sample-every
seconds; sampling is not free (reading a process's smaps walks all its mappings, the
memory-mapped Arrow files included), and its CPU time is reported. The stage seconds come
from prepare's own "seconds:" log line. Each run directory is deleted after its run; the
manifests' pairs sha256, the vocabulary's sha256, the dropped counts and dropped.tsv's sha256
are compared (every worker count must prepare the same data). Between prepare's log lines,
the peak anonymous memory of the tree is reported: which step holds what.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtx.bench.harness import PeakMemory, describe_machine, machine, result, timed, timestamped
from mtx.checkpoint import Manifest, RunDir
from mtx.errors import MtxError
from mtx.files import sha256_file


def build_corpus(prefix: Path, data: Path, pairs: int, seed: int = 1) -> None:
    src = (data / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (data / "train.de").read_text(encoding="utf-8").splitlines()
    rng = random.Random(seed)
    with open(f"{prefix}.en", "w", encoding="utf-8") as fe, open(f"{prefix}.de", "w") as fd:
        for _ in range(pairs):
            picks = [rng.randrange(len(src)) for _ in range(rng.randint(2, 3))]
            fe.write(" ".join(src[i] for i in picks) + "\n")
            fd.write(" ".join(tgt[i] for i in picks) + "\n")


def prepare_command(o: Options, corpus: Path, run_dir: Path, spec: str) -> list[str]:
    """`mtx prepare` with data.workers W, given as "W" (every core) or "W@C" (C cores)."""
    workers, _, ncores = spec.partition("@")
    sets = [f"run_dir={run_dir}", f"data.train={corpus}", f"data.workers={workers}"]
    sets += [f"data.valid={o.data / 'val'}", f"data.test={o.data / 'test2016'}", *o.sets]
    command = [sys.executable, "-m", "mtx", "prepare", "--config", str(o.config)]
    if ncores:  # the process and its workers on the first C cores
        command = ["taskset", "-c", f"0-{int(ncores) - 1}", *command]
    return command + [x for s in sets for x in ("--set", s)]


def prepare_run(o: Options, corpus: Path, spec: str) -> dict:
    """One `mtx prepare` of the corpus with data.workers `spec`: its figures."""
    run_dir = o.work / f"run-{spec}"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = prepare_command(o, corpus, run_dir, spec)

    def prepare() -> tuple[str, PeakMemory, list]:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
        with PeakMemory(proc.pid, o.sample_every) as peak:
            lines = timestamped(proc.stdout)
            proc.wait()
        out = "".join(line for _, line in lines)
        if proc.returncode:
            raise RuntimeError(f"prepare with data.workers {spec} failed:\n{out[-3000:]}")
        return out, peak, lines

    timing, (out, peak, lines) = timed(prepare, repeats=1, warmup=0)
    stages = re.search(r"seconds: (.*)", out).group(1)
    manifest = Manifest.read(RunDir(run_dir).data.manifest)
    figures = {
        "workers": spec,
        "wall_seconds": timing.median,
        "stages": {k: float(v) for k, v in (x.split() for x in stages.split(", "))},
        "peak_pss_bytes": peak.peak.pss,
        "peak_pss_anon_bytes": peak.peak.anon,
        "sampler_cpu_seconds": peak.sampler_cpu_s,
        "anon_by_step": anon_by_step(peak, lines),
        "train_pairs": manifest.splits["train"].kept,
        "data_sha256": {k: v.pairs_sha256 for k, v in manifest.splits.items()},
        "vocabulary_sha256": manifest.spm_sha256,
        "dropped": {k: v.dropped for k, v in manifest.splits.items()},
        "dropped_sha256": sha256_file(RunDir(run_dir).data.dropped),
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return figures


SAME = ("data_sha256", "vocabulary_sha256", "dropped", "dropped_sha256")  # what must not change


def anon_by_step(peak: PeakMemory, lines: list[tuple[float, str]]) -> list[tuple[str, int]]:
    """The peak anonymous memory from each of prepare's log lines to the next (the steps it
    says it begins), with the line that began it (the first: the start, before any line)."""
    starts = [(peak.samples[0][0] if peak.samples else 0.0, "(start)")]
    starts += [(t, line.strip()[:70]) for t, line in lines]
    ends = [t for t, _ in starts[1:]] + [float("inf")]
    return [(what, peak.peak_between(t, end).anon) for (t, what), end in zip(starts, ends)]


def table(results: list[dict], pairs: int) -> str:
    same = len({json.dumps([r[k] for k in SAME]) for r in results}) == 1
    stages = list(results[0]["stages"])
    out = [
        f"corpus: {pairs:,} pairs; {describe_machine(machine())}; same data: {same}",
        "| workers | " + " | ".join(stages) + " | total | peak PSS (anonymous) | sampler CPU |",
        "|---" * (len(stages) + 4) + "|",
    ]
    for r in results:
        cells = [f"{r['stages'][s]:.1f} s" for s in stages]
        out.append(f"| {r['workers']} | " + " | ".join(cells) + f" | {r['wall_seconds']:.1f} s | "
                   f"{r['peak_pss_bytes'] / 2**30:.2f} GiB ({r['peak_pss_anon_bytes'] / 2**30:.2f}) "
                   f"| {r['sampler_cpu_seconds']:.1f} s |")  # fmt: skip
    for r in results:
        out.append(f"peak anonymous memory by step, data.workers {r['workers']}:")
        out += [f"  {anon / 2**30:.2f} GiB  {what}" for what, anon in r["anon_by_step"] if anon]
    for r in results[1:]:
        a, b = results[0]["stages"]["encode"], r["stages"]["encode"]
        out.append(f"encoding with data.workers {r['workers']}: {a / b:.2f}x the speed of "
                   f"{results[0]['workers']}")  # fmt: skip
    return "\n".join(out)


@dataclass
class Options:
    """What `mtx bench prepare` is asked for (its flags)."""

    pairs: int = 4_500_000  # pairs of the corpus built from --data
    workers: list[str] = field(default_factory=lambda: ["1@1", "1", "2"])  # W, or W@C cores
    work: Path = Path("/tmp/bench_prepare")  # the corpus and the run directories
    data: Path = Path("data/multi30k")  # Multi30k's plain-text files
    config: Path = Path("configs/base.yaml")  # what `mtx prepare` runs with
    sample_every: float = 2.0  # seconds between memory samples
    json: Path | None = None  # also write the JSON result here
    sets: list[str] = field(default_factory=list)  # --set KEY=VALUE for every `mtx prepare`


def run(o: Options) -> str:
    """`mtx bench prepare`: one `mtx prepare` per --workers entry; the table (and the JSON
    result written to `o.json` if given)."""
    for path, what in ((o.data / "train.en", "--data"), (o.config, "--config")):
        if not path.is_file():
            raise MtxError(f"{what}: no such file: {path}")
    o.work.mkdir(parents=True, exist_ok=True)
    corpus = o.work / f"corpus-{o.pairs}-2to3"
    if not Path(f"{corpus}.de").is_file():
        build_corpus(corpus, o.data, o.pairs)
    results = [prepare_run(o, corpus, spec) for spec in o.workers]
    if o.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()}
        report = result("prepare", {"runs": results}, **settings, cpus=os.cpu_count())
        o.json.write_text(json.dumps(report) + "\n")
    return table(results, o.pairs)
