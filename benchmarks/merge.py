"""The cost of a corpus job's merge (mtx/jobs/shards.py): rank 0 writing the output from the
parts, its own read from disk and the others' received over gloo, as on machines with their
own disks. For the scale-out estimate of docs/distributed.md and BENCHMARKS.md.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m benchmarks.merge \
        --megabytes 400 --work /tmp/bench_merge [--line-bytes 150] [--chunk-lines 512]

Each process writes its share of a synthetic output of --megabytes (lines of --line-bytes
bytes, in chunks of --chunk-lines, dealt round robin: process r holds every chunk i with
i % processes == r) into a part of its own, in WORK/nodeRANK (its own disk); then rank 0
merges them, timed by the harness (one warm-up merge, then 3), and prints the JSON result:
megabytes per second, and the share that travelled between processes.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from mtx.bench.harness import result, timed
from mtx.distributed import Dist
from mtx.jobs.shards import Part, merge, parts_dir, scan


def write_part(output: Path, rank: int, world: int, lines: int, a: argparse.Namespace) -> None:
    """This process's chunks of the synthetic output, in its part."""
    part = Part(parts_dir(output), f"bench-{rank}", "bench")
    for number, first in enumerate(range(0, lines, a.chunk_lines)):
        if number % world == rank:
            n = min(a.chunk_lines, lines - first)
            part.add(first, [f"{first + i:0{a.line_bytes - 1}d}\n" for i in range(n)])
    part.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=400)
    parser.add_argument("--line-bytes", type=int, default=150)
    parser.add_argument("--chunk-lines", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_merge"))
    a = parser.parse_args()
    dist = Dist.from_env(torch.device("cpu"), 600, backend="gloo")
    node = a.work / f"node{dist.rank}"
    shutil.rmtree(node, ignore_errors=True)
    node.mkdir(parents=True)
    output = node / "out.txt"
    lines = int(a.megabytes * 1e6 / a.line_bytes)
    write_part(output, dist.rank, dist.world, lines, a)
    held = dist.gather(scan(parts_dir(output), "bench"))
    timing, _ = timed(lambda: merge(dist, output, held, lines, 1), repeats=3, warmup=1)
    if dist.main:
        size = output.stat().st_size
        away = sum(b.size for blocks in held[1:] for b in blocks)
        figures = {
            "megabytes": size / 1e6,
            "merge": timing.as_dict(),
            "megabytes_per_s": size / 1e6 / timing.median,
            "travelled_share": away / size,
            "processes": dist.world,
        }
        print(json.dumps(result("merge", figures, **{k: str(v) for k, v in vars(a).items()})))
    dist.close()
    shutil.rmtree(node, ignore_errors=True)


if __name__ == "__main__":
    main()
