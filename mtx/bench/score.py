"""Scoring against translating: `mtx score`'s forced decoding beside `mtx translate`'s searches
on the same lines, and whether the model tells real pairs from shuffled ones.

    mtx bench score --checkpoint RUN/checkpoints/best.pt \
        --src data/multi30k/test2016.en [--tgt ...test2016.de] [--beam 4 --beam 1] \
        [--lines N] [--threads 2] [--device cpu] [--rounds 3] [--json]

In one process, on the same lines: scoring the (source, reference) pairs, then translating the
sources at each --beam, --rounds times, the order reversed every other round (the harness's
timer: the median counts, the spread is reported), so that a busy spell on a shared machine
slows each alike. Reported: seconds and pairs/s of each, each search's time over scoring's,
and the share of lines whose real pair scores higher (mean log-probability per target token)
than the same source with another line's target (the targets rotated by half the file).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from mtx.bench.harness import describe_machine, result, timed
from mtx.data.sources import read_lines
from mtx.decode.score import Scorer
from mtx.decode.translator import Translator
from mtx.errors import MtxError


@dataclass
class Options:
    """What `mtx bench score` is asked for (its flags)."""

    checkpoint: Path
    src: Path
    tgt: Path | None = None  # default: --src with the target language's suffix
    lines: int = 0  # only the first N lines (0: all)
    beams: list[int] = field(default_factory=lambda: [4, 1])
    threads: int = 2
    device: str = "cpu"
    rounds: int = 3
    json_out: bool = False


def target_path(o: Options, tr: Translator) -> Path:
    if o.tgt is not None:
        return o.tgt
    lang = tr.parts.config.data.tgt_lang
    path = o.src.with_suffix(f".{lang}")
    if not path.is_file():
        raise MtxError(f"--tgt not given and {path} does not exist")
    return path


def bench(o: Options) -> dict:
    torch.set_num_threads(o.threads)
    tr = Translator.from_checkpoints(o.checkpoint, [], device=o.device)
    src = list(read_lines(o.src))
    tgt = list(read_lines(target_path(o, tr)))
    if len(src) != len(tgt):
        raise MtxError(f"{o.src} has {len(src)} lines but its targets {len(tgt)}")
    if o.lines:
        src, tgt = src[: o.lines], tgt[: o.lines]
    scorer = Scorer(tr.parts)
    jobs = {"score": lambda: scorer.score(src, tgt)}
    for beam in o.beams:
        jobs[f"translate, beam {beam}"] = lambda b=tr.options(beam=beam): tr.translate(src, b)
    for job in jobs.values():  # warm-up: every shape's kernels planned once
        job()
    sync = torch.cuda.synchronize if tr.parts.device.type == "cuda" else None
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for r in range(o.rounds):
        for name in list(jobs)[:: 1 if r % 2 == 0 else -1]:
            timing, _ = timed(jobs[name], repeats=1, warmup=0, sync=sync)
            seconds[name] += timing.seconds
    real = scorer.score(src, tgt)
    half = len(tgt) // 2 or 1
    shuffled = scorer.score(src, tgt[half:] + tgt[:half])
    above = sum(a.mean > b.mean for a, b in zip(real, shuffled)) / len(real)
    figures = {}
    for name, xs in seconds.items():
        median = sorted(xs)[len(xs) // 2]
        figures[name] = {
            "seconds": median,
            "spread": max(xs) - min(xs),
            "pairs_per_s": len(src) / median,
        }
    base = figures["score"]["seconds"]
    for name in jobs:
        figures[name]["vs_score"] = figures[name]["seconds"] / base
    return {"lines": len(src), "jobs": figures, "real_above_shuffled": above}


def table(r: dict) -> str:
    lines = [
        f"{describe_machine(r['machine'])}; {r['lines']} lines",
        "",
        "| job | seconds (median) | spread | pairs/s | time over scoring's |",
        "|---|---|---|---|---|",
    ]
    for name, f in r["jobs"].items():
        lines.append(
            f"| {name} | {f['seconds']:.2f} | {f['spread']:.2f} | {f['pairs_per_s']:,.0f} | "
            f"{f['vs_score']:.1f}x |"
        )
    lines.append("")
    lines.append(f"real pairs above shuffled: {r['real_above_shuffled']:.1%} of the lines")
    return "\n".join(lines)


def run(o: Options) -> str:
    r = result("score", bench(o), **{k: str(v) for k, v in asdict(o).items()})
    return json.dumps(r) if o.json_out else table(r)
