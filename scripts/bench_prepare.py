"""`mtx prepare` of a WMT-size corpus with 1 and 2 encoding workers: time per stage, peak memory.

    python scripts/bench_prepare.py [--pairs 4500000] [--workers 1@1,1,2] [--work /tmp/bench_prepare]
                                    [--sample-every 2]

The corpus is built from Multi30k's training pairs (../shared/data/multi30k), joining 2 or 3
pairs picked at random (seed 1) into one, about WMT's sentence lengths (few duplicates); valid and test are
Multi30k's val and test2016. Each `mtx prepare` (configs/base.yaml: vocabulary 37,000, max_len
250) runs in its own process, one after the other; the peak memory is the proportional set
size (PSS: shared pages split among the processes that share them) of the whole process tree
(the main process and its encoding workers), sampled from /proc every --sample-every seconds
(default 2). Sampling is not free: reading a process's smaps_rollup walks all its mappings,
memory-mapped Arrow files included, and the sampler's CPU time (in the table) is taken from the
cores the workers run on; every 0.2 s it took 17 s of CPU in a 109 s run of 1.5M pairs and
slowed 2 workers' encoding by 14%. The stage seconds come from prepare's own "seconds:" log
line. The run directories are deleted after each run; the manifests' pairs sha256 are
compared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def build_corpus(prefix: Path, pairs: int, seed: int = 1) -> None:
    src = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()
    rng = random.Random(seed)
    with open(f"{prefix}.en", "w", encoding="utf-8") as fe, open(f"{prefix}.de", "w") as fd:
        for _ in range(pairs):
            picks = [rng.randrange(len(src)) for _ in range(rng.randint(2, 3))]
            fe.write(" ".join(src[i] for i in picks) + "\n")
            fd.write(" ".join(tgt[i] for i in picks) + "\n")


def tree_memory(pid: int) -> tuple[int, int]:
    """(proportional set size, of which anonymous: not file pages such as memory-mapped Arrow
    files) of `pid` and all its descendants, in bytes; a page that processes share counts once
    over all of them."""
    pss = anon = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            pss += int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1)) * 1024
            anon += int(re.search(r"^Pss_Anon:\s+(\d+) kB", rollup, re.M).group(1)) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, AttributeError):
            continue  # ended meanwhile
    return pss, anon


def run(corpus: Path, work: Path, spec: str, every: float) -> dict:
    """`mtx prepare` with data.workers W, given as "W" (every core) or "W@C" (C cores)."""
    workers, _, ncores = spec.partition("@")
    run_dir = work / f"run-{spec}"
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = [f"run_dir={run_dir}", f"data.train={corpus}", f"data.workers={workers}"]
    sets += [f"data.valid={MULTI30K / 'val'}", f"data.test={MULTI30K / 'test2016'}"]
    command = [sys.executable, "-m", "mtx", "prepare", "--config", str(ROOT / "configs/base.yaml")]
    if ncores:  # the process and its workers on the first C cores
        command = ["taskset", "-c", f"0-{int(ncores) - 1}", *command]
    command += [x for s in sets for x in ("--set", s)]
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, sampler_cpu = [0, 0], [0.0]

    def sample() -> None:
        while proc.poll() is None:
            peak[:] = map(max, peak, tree_memory(proc.pid))
            sampler_cpu[0] = time.thread_time()
            time.sleep(every)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out = proc.communicate()[0]
    sampler.join()
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"prepare with data.workers {spec} failed:\n{out[-3000:]}")
    stages = re.search(r"seconds: (.*)", out).group(1)
    manifest = json.loads((run_dir / "prepared" / "manifest.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "workers": spec,
        "wall_seconds": wall,
        "stages": {k: float(v) for k, v in (x.split() for x in stages.split(", "))},
        "peak_pss_bytes": peak[0],
        "peak_pss_anon_bytes": peak[1],
        "sampler_cpu_seconds": sampler_cpu[0],
        "train_pairs": manifest["splits"]["train"]["kept"],
        "pairs_sha256": {k: v["pairs_sha256"] for k, v in manifest["splits"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4_500_000)
    ap.add_argument(
        "--workers",
        default="1@1,1,2",
        help="comma-separated runs: data.workers W, or W@C on C cores (taskset)",
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_prepare"))
    ap.add_argument("--sample-every", type=float, default=2.0, help="seconds between samples")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / f"corpus-{args.pairs}-2to3"
    if not Path(f"{corpus}.de").is_file():
        build_corpus(corpus, args.pairs)
    results = [run(corpus, args.work, w, args.sample_every) for w in args.workers.split(",")]
    print(json.dumps(results, indent=1))
    same = len({json.dumps(r["pairs_sha256"], sort_keys=True) for r in results}) == 1
    print(f"\ncorpus: {args.pairs:,} pairs; cpus: {os.cpu_count()}; same data: {same}\n")
    stages = list(results[0]["stages"])
    print("| workers | " + " | ".join(stages) + " | total | peak PSS (anonymous) | sampler CPU |")
    print("|---" * (len(stages) + 4) + "|")
    for r in results:
        cells = [f"{r['stages'][s]:.1f} s" for s in stages]
        print(f"| {r['workers']} | " + " | ".join(cells) + f" | {r['wall_seconds']:.1f} s | "
              f"{r['peak_pss_bytes'] / 2**30:.2f} GiB ({r['peak_pss_anon_bytes'] / 2**30:.2f}) | "
              f"{r['sampler_cpu_seconds']:.1f} s |")  # fmt: skip
    for r in results[1:]:
        a, b = results[0]["stages"]["encode"], r["stages"]["encode"]
        print(f"encoding with data.workers {r['workers']}: {a / b:.2f}x the speed of "
              f"{results[0]['workers']}")  # fmt: skip


if __name__ == "__main__":
    main()
