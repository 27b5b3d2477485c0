"""Subword regularisation (data.bpe_dropout, BPE-dropout on the fly): how fast one core segments,
how much longer the segmentations are, and what it does for a low-resource model.

    python -m benchmarks.bpe_dropout rate [--alpha 0.1] [--pairs 29000] [--json]
    python -m benchmarks.bpe_dropout bleu [--pairs 10000] [--seeds 1 2 3] [--max-steps 3000]
                                       [--set KEY=VALUE ...] [--work DIR] [--json]

`rate`: Multi30k en-de's training pairs prepared (SentencePiece BPE 8000), then segmented
as a loader worker does for an epoch (data/bpe_dropout.py's Resegment, one process, one
thread), against the prepared segmentation: pairs per second per core, and the sampled
tokens per prepared token.

`bleu`: the first --pairs pairs of Multi30k de->en, a small model (benchmarks/multilingual.py's
settings) trained until the validation loss has not improved for 3 validations (at most
--max-steps updates), with data.bpe_dropout 0 and 0.1, each seed; test2016 BLEU of best.pt, the
updates run and the mean padding of the logged training windows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import datasets
import yaml

from benchmarks.multilingual import M30K, SMALL
from mtx.bench.harness import mtx, result, timed
from mtx.data.bpe_dropout import Resegment
from mtx.train.metrics import read_metrics


def prepare_multi30k(run: Path, pairs: int, src: str, tgt: str) -> Path:
    """The first `pairs` Multi30k training pairs, src->tgt, prepared into run/prepared."""
    data = run / "data"
    data.mkdir(parents=True, exist_ok=True)
    for lang in (src, tgt):
        lines = (M30K / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        (data / f"train.{lang}").write_text("".join(lines[:pairs]), encoding="utf-8")
    config = run / "run.yaml"
    config.write_text(yaml.safe_dump({"run_dir": str(run), "data": {
        "src_lang": src, "tgt_lang": tgt, "train": f"{data}/train", "valid": [f"{M30K}/val"],
        "test": f"{M30K}/test2016"}}))  # fmt: skip
    mtx("prepare", "--config", config, *(x for s in SMALL for x in ("--set", s)))
    return run / "prepared"


def rate(work: Path, alpha: float, pairs: int) -> dict:
    prepared = prepare_multi30k(work / "rate", pairs, "en", "de")
    ds = datasets.load_from_disk(str(prepared / "train"))
    batch, rows = ds[:], list(range(len(ds)))
    r = Resegment((prepared / "spm.model").read_bytes(), alpha, 1, False, 128).for_epoch(0)
    timing, (src, tgt) = timed(lambda: r(rows, batch), repeats=3, warmup=1)
    sampled = sum(map(len, src)) + sum(map(len, tgt))
    prepared_tokens = sum(batch["src_len"]) + sum(batch["tgt_len"])
    return {
        "pairs": len(ds),
        "pairs_per_s_per_core": len(ds) / timing.median,
        "spread": timing.spread,
        "tokens_per_prepared_token": sampled / prepared_tokens,
        "prepared_tokens_per_pair": prepared_tokens / len(ds),
    }


def bleu_run(work: Path, prepared: Path, alpha: float, seed: int, args) -> dict:
    run = work / f"a{alpha}-s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    if not (run / "prepared").exists():
        (run / "prepared").symlink_to(prepared)
    sets = [*SMALL, f"run_dir={run}", f"data.bpe_dropout={alpha}", f"train.seed={seed}",
            f"train.max_steps={args.max_steps}", "train.valid_every=200", "train.patience=3",
            "train.workers=1", *args.set]  # fmt: skip
    config = prepared.parent / "run.yaml"
    mtx("train", "--config", config, *(x for s in sets for x in ("--set", s)), "--overwrite")
    out = mtx("evaluate", "--checkpoint", run / "checkpoints" / "best.pt", "--src",
              f"{M30K}/test2016.de", "--ref", f"{M30K}/test2016.en", "--json")  # fmt: skip
    info = json.loads(mtx("info", run / "checkpoints" / "best.pt", "--json").stdout)
    logged = read_metrics(run / "metrics.jsonl", "train")
    return {"alpha": alpha, "seed": seed, "bleu": json.loads(out.stdout)["bleu"],
            "best_step": info["step"], "updates": logged[-1]["step"],
            "padding": sum(r["padding"] for r in logged) / len(logged)}  # fmt: skip


def bleu(work: Path, args) -> dict:
    prepared = prepare_multi30k(work / "low", args.pairs, "de", "en")
    runs = [bleu_run(work, prepared, a, s, args) for s in args.seeds for a in (0.0, 0.1)]
    out = {"runs": runs}
    for alpha in (0.0, 0.1):
        scores = [r["bleu"] for r in runs if r["alpha"] == alpha]
        out[f"alpha {alpha}"] = {
            "mean": statistics.mean(scores),
            "range": [min(scores), max(scores)],
        }
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bpe_dropout", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("what", choices=["rate", "bleu"])
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--pairs", type=int, help="training pairs (rate: 29000; bleu: 10000)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        if args.what == "rate":
            figures = rate(work, args.alpha, args.pairs or 29000)
        else:
            args.pairs = args.pairs or 10000
            figures = bleu(work, args)
    out = result(f"sampling {args.what}", figures, **{k: str(v) for k, v in vars(args).items()})
    print(json.dumps(out) if args.json else json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
