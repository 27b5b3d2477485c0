"""Fine-tuning a Multi30k en->de model on new captions: the new-domain gain and the old-domain
change, side by side, with and without some old data mixed in.

    python -m benchmarks.finetune [--general CKPT] [--updates 500] [--set KEY=VALUE ...]
                                  [--work DIR] [--json]

test2017 is cut as scripts/finetune_multi30k.sh cuts it (lines 1-400 to fine-tune on, 401-500
to validate, 501-1000 to test). The general model is --general, or one trained first on
Multi30k's training pairs (benchmarks/multilingual.py's settings, --updates updates). Each
fine-tuning run is configs/finetune.yaml (validated on both the new and the old data) with
one change: as it is (a fifth of each epoch old data), the new data alone, and the new data
alone at a peak learning rate like a training run's. Each model is scored with `mtx
evaluate` (beam 4) on test2017 501-1000 (new) and test2016 (old).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from benchmarks.multilingual import M30K, SMALL, corpus, train_run
from mtx.bench.harness import ROOT, mtx, result
from mtx.train.metrics import read_metrics

CONFIG = ROOT / "configs" / "finetune.yaml"
# the runs: (directory, name, what changes in configs/finetune.yaml; "old": no old data)
RUNS = [
    ("mixed", "configs/finetune.yaml (new + old data)", []),
    ("new", "new data alone", ["old"]),
    ("new-fast", "new data alone, a training run's peak rate", ["old", "train.lr_scale=0.25"]),
]


def cut(data: Path) -> None:
    """test2017 into data/ft_{train,valid,test}.{en,de}: lines 1-400, 401-500, 501-1000."""
    data.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = (M30K / f"test2017.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        for name, part in (
            ("train", lines[:400]),
            ("valid", lines[400:500]),
            ("test", lines[500:]),
        ):
            (data / f"ft_{name}.{lang}").write_text("".join(part), encoding="utf-8")


def corpora(data: Path, without_old: bool) -> list[dict]:
    """configs/finetune.yaml's corpora, its paths pointed at `data` and the real Multi30k."""
    text = CONFIG.read_text().replace("runs/finetune/data", str(data))
    entries = yaml.safe_load(text.replace("data/multi30k", str(M30K)))["data"]["corpora"]
    if without_old:  # the old data's validation set stays: forgetting shows while it trains
        entries[0]["valid"] = [f"new={entries[0]['valid'][0]}", f"old={M30K}/val"]
        return entries[:1]
    return entries


def fine_tune(
    work: Path, general: Path, directory: str, change: list[str], more: list[str]
) -> dict:
    run = work / directory
    sets = [f"run_dir={run}", f"data.corpora={json.dumps(corpora(work / 'data', 'old' in change))}"]
    sets += [c for c in change if c != "old"] + more
    args = ["--config", CONFIG, *(x for s in sets for x in ("--set", s))]
    mtx("prepare", *args, "--set", f"data.spm_model={general}")
    mtx("train", *args, "--init-from", general, "--overwrite")
    valid = read_metrics(run / "metrics.jsonl", "valid")
    best = max(valid, key=lambda r: r["valid_bleu/new"])
    return {"checkpoint": run / "checkpoints" / "best.pt", "best_step": best["step"],
            "validations": [{k: v for k, v in r.items() if "bleu" in k or k == "step"}
                            for r in valid]}  # fmt: skip


def scores(ckpt: Path, data: Path, more: list[str]) -> dict:
    out = {}
    for name, prefix in (("new", data / "ft_test"), ("old", M30K / "test2016")):
        answer = mtx("evaluate", "--checkpoint", ckpt, "--src", f"{prefix}.en",
                     "--ref", f"{prefix}.de", "--json", *(x for s in more for x in ("--set", s)))  # fmt: skip
        figures = json.loads(answer.stdout)
        out[name] = {"bleu": figures["bleu"], "chrf": figures["chrf"]}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.finetune", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--general", type=Path, help="the en->de model to fine-tune")
    ap.add_argument("--updates", type=int, default=500, help="the general model's, if trained")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        cut(work / "data")
        general = args.general
        if general is None:
            train_run(work / "general", [corpus("en", "de")], args.updates, 1, args.set)
            general = work / "general" / "checkpoints" / "last.pt"
        rows = {"general": {"scores": scores(general, work / "data", args.set)}}
        for directory, name, change in RUNS:
            row = fine_tune(work, general, directory, change, args.set)
            row["scores"] = scores(row.pop("checkpoint"), work / "data", args.set)
            rows[name] = row
    out = result("finetune", {"runs": rows}, general=str(general), updates=args.updates,
                 sets=SMALL + args.set)  # fmt: skip
    if args.json:
        print(json.dumps(out, default=str))
        return
    base = rows["general"]["scores"]
    for name, row in rows.items():
        s = row["scores"]
        print(f"{name}: new {s['new']['bleu']:.2f} ({s['new']['bleu'] - base['new']['bleu']:+.2f}), "
              f"old {s['old']['bleu']:.2f} ({s['old']['bleu'] - base['old']['bleu']:+.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
