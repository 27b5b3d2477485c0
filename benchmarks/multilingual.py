"""One model for both directions of Multi30k against a bilingual model for each.

    python -m benchmarks.multilingual [--updates 500] [--seeds 1 2 3] [--set KEY=VALUE ...]
                                      [--work DIR] [--json]

For each seed: a bilingual en->de and a bilingual de->en model, `--updates` updates each, and
one model of both directions (data.corpora, the source tagged >>de<< or >>en<<) for as many
updates as the two together, with the same shape and settings (configs/multi30k.yaml's data
settings and batches, a smaller model: SMALL, then --set). Each is scored with `mtx evaluate` (its decode.* settings, the last
checkpoint) on test2016 in each direction it knows, the bidirectional model on test2017 too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import yaml

from mtx.bench.harness import ROOT, mtx, result, timed

M30K = Path(os.environ.get("M30K", ROOT / "data" / "multi30k"))  # mtx fetch multi30k
# configs/multi30k.yaml's vocabulary, lengths and batches, and a model a CPU trains in
# minutes: d_model 128, 2+2 layers, fairseq's few-update Multi30k recipe scaled down
SMALL = [
    "data.vocab_size=8000", "data.max_len=128", "train.max_tokens=4096", "model.d_model=128", "model.d_ff=512", "model.n_heads=4", "model.encoder_layers=2",
    "model.decoder_layers=2", "model.dropout=0.1", "train.warmup_steps=200",
    "train.lr_scale=0.5", "train.bleu_every=0", "train.log_every=50",
    # the data as these benchmarks' figures were measured: before data.clean's rules
    "data.dedup=false", "data.clean.langid=0", "data.clean.copy=0", "data.clean.numbers=false",
    "data.clean.nontext=false", "data.clean.markup=false", "data.clean.max_nonletters=1",
]  # fmt: skip
DIRECTIONS = (("en", "de"), ("de", "en"))


def corpus(src: str, tgt: str) -> dict:
    d = str(M30K)
    return {"src_lang": src, "tgt_lang": tgt, "train": f"{d}/train", "valid": [f"{d}/val"],
            "test": f"{d}/test2016"}  # fmt: skip


def train_run(run: Path, corpora: list[dict], updates: int, seed: int, sets: list[str]) -> float:
    """Prepare and train one run; its training seconds."""
    run.mkdir(parents=True, exist_ok=True)
    config = run.parent / f"{run.name}.yaml"
    config.write_text(yaml.safe_dump({"run_dir": str(run), "data": {"corpora": corpora}}))
    args = ["--config", config]
    for item in [*SMALL, f"train.max_steps={updates}", f"train.valid_every={updates}",
                 f"train.seed={seed}", *sets]:  # fmt: skip
        args += ["--set", item]
    mtx("prepare", *args)
    return timed(lambda: mtx("train", *args, "--overwrite"), repeats=1, warmup=0)[0].median


def bleu(ckpt: Path, test: str, src: str, tgt: str, tagged: bool) -> float:
    lang = ["--tgt-lang", tgt] if tagged else []
    out = mtx("evaluate", "--checkpoint", ckpt, "--src", f"{M30K}/{test}.{src}",
              "--ref", f"{M30K}/{test}.{tgt}", "--json", *lang)  # fmt: skip
    return json.loads(out.stdout)["bleu"]


def one_seed(work: Path, seed: int, updates: int, sets: list[str]) -> dict:
    row: dict = {"seed": seed}
    for src, tgt in DIRECTIONS:
        run = work / f"{src}-{tgt}-{seed}"
        seconds = train_run(run, [corpus(src, tgt)], updates, seed, sets)
        ckpt = run / "checkpoints" / "last.pt"
        row[f"bilingual {src}-{tgt}"] = {
            "test2016": bleu(ckpt, "test2016", src, tgt, False), "train_s": seconds}  # fmt: skip
    run = work / f"both-{seed}"
    seconds = train_run(run, [corpus(*d) for d in DIRECTIONS], 2 * updates, seed, sets)
    ckpt = run / "checkpoints" / "last.pt"
    row["both"] = {"train_s": seconds}
    for src, tgt in DIRECTIONS:
        for test in ("test2016", "test2017"):
            row["both"][f"{test} {src}-{tgt}"] = bleu(ckpt, test, src, tgt, True)
    return row


def summary(rows: list[dict]) -> dict:
    """Per direction: the bilingual and bidirectional test2016 BLEU, mean and spread."""
    out = {}
    for src, tgt in DIRECTIONS:
        d = f"{src}-{tgt}"
        bi = [r[f"bilingual {d}"]["test2016"] for r in rows]
        both = [r["both"][f"test2016 {d}"] for r in rows]
        out[d] = {
            "bilingual": statistics.mean(bi), "both": statistics.mean(both),
            "difference": statistics.mean(both) - statistics.mean(bi),
            "bilingual_range": [min(bi), max(bi)], "both_range": [min(both), max(both)],
            "both_test2017": statistics.mean(r["both"][f"test2017 {d}"] for r in rows),
        }  # fmt: skip
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.multilingual", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--updates", type=int, default=500, help="each bilingual model's updates")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--work", type=Path, help="keep the runs here (default: a temporary dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        rows = [one_seed(work, seed, args.updates, args.set) for seed in args.seeds]
    out = result("multilingual", {"runs": rows, "summary": summary(rows)},
                 updates=args.updates, seeds=args.seeds, sets=SMALL + args.set)  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return
    for d, s in out["summary"].items():
        print(f"{d}: bilingual {s['bilingual']:.2f}, both directions {s['both']:.2f} "
              f"({s['difference']:+.2f}); test2017 {s['both_test2017']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
