"""Word alignment against gold: eflomal, mtx's attention without guidance, and mtx trained with
guided alignment, on the RWTH German-English gold set's first 200 pairs (docs/alignment.md).

    python -m benchmarks.alignment data --work W          # the training text
    python -m benchmarks.alignment train --work W --steps 1600   # both models, side by side
    python -m benchmarks.alignment measure --work W [--json]     # AER, BLEU, cost

Every aligner learns from the same text: Multi30k's training pairs, lowercased and tokenised
($M30K_TOK, default ../shared/data/multi30k-tok), German -> English, plus the gold pairs' own
sentences lowercased ($RWTH, default ../shared/data/rwth-align-dev; unsupervised aligners may
see the sentences they align, never the gold links). eflomal aligns that text (`mtx align
corpus`) and its last 200 lines are scored. The two mtx models are configs/multi30k.yaml's
shape trained from the same prepared data, seed and number of updates, on the CPU with one
thread each, at the same time: one plain, one with train.align_weight 0.05 on the first head
of the penultimate decoder layer, learning from eflomal's alignments of its prepared data
(`mtx align prepared`). Each model aligns the gold pairs by a forced pass (`mtx score
--alignments`); the unguided one is read at every layer (every head averaged) and at every
single head of every layer, the guided one at its guided head too. BLEU: Multi30k test2016
de->en (tokenised), beam 4. Cost: `mtx translate` of test2016 with and without --alignments,
beam 4, alternately three times each in this process, the best of each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mtx.bench.harness import ROOT, result, timed

M30K_TOK = Path(os.environ.get("M30K_TOK", ROOT.parent / "shared" / "data" / "multi30k-tok"))
RWTH = Path(os.environ.get("RWTH", ROOT.parent / "shared" / "data" / "rwth-align-dev"))
MODELS = ("unguided", "guided")
# the toy models' readings: (layer, heads, reading); heads None: a guided model's own heads
TOY_READINGS = [(-2, None, r) for r in ("auto", "full", "step", "shift")]
TOY_READINGS += [(layer, [], r) for layer in (0, 1) for r in ("step", "shift")]
TOY_READINGS += [(1, [h], "step") for h in range(4)]
# the toy models: unguided; guided in the translating pass (as before train.align_context) and
# in a full-context pass (the default), each at Garg et al.'s weight 0.05 and at 0.5 (the one
# docs/alignment.md advises)
CAUSAL = ["--set", "train.align_context=causal"]
TOY_RUNS = {
    "unguided": [],
    "guided-causal": ["--set", "train.align_weight=0.05", *CAUSAL],
    "guided-causal-0.5": ["--set", "train.align_weight=0.5", *CAUSAL],
    "guided-full-0.05": ["--set", "train.align_weight=0.05"],
    "guided-full": ["--set", "train.align_weight=0.5"],
}


def mtx(*args: str, threads: int = 1, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "mtx", *args]
    return subprocess.run(cmd, check=True, text=True, capture_output=True, env=env, **kw)


def data(work: Path) -> None:
    """W/data/{train,val,test2016}.{de,en}: Multi30k tokenised, the gold pairs lowercased
    appended to the training pairs; W/gold.{de,en} those pairs as the gold file counts them."""
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        gold = (RWTH / f"dev.{lang}").read_text(encoding="utf-8").lower()
        (work / f"gold.{lang}").write_text(gold, encoding="utf-8")
        train = (M30K_TOK / f"train.{lang}").read_text(encoding="utf-8")
        (out / f"train.{lang}").write_text(train + gold, encoding="utf-8")
        for split in ("val", "test2016"):
            shutil.copy(M30K_TOK / f"{split}.{lang}", out / f"{split}.{lang}")


def settings(work: Path, name: str, steps: int) -> list[str]:
    d = work / "data"
    out = [
        f"run_dir={work / name}", "data.src_lang=de", "data.tgt_lang=en",
        f"data.train={d / 'train'}", f"data.valid={d / 'val'}", f"data.test={d / 'test2016'}",
        "train.device=cpu", "train.threads=1", f"train.max_steps={steps}",
        f"train.warmup_steps={max(1, steps // 2)}", f"train.valid_every={steps}",
        "train.bleu_every=0", "train.log_every=100",
    ]  # fmt: skip
    if name == "guided":
        out += ["train.align_weight=0.05", "train.align_layer=-2", "train.align_heads=1"]
    return [x for s in out for x in ("--set", s)]


def train(work: Path, steps: int) -> dict:
    """Prepare once, align the prepared data, and train both models at the same time."""
    config = str(ROOT / "configs" / "multi30k.yaml")
    first = work / MODELS[0]
    if not (first / "prepared" / "manifest.json").is_file():
        mtx("prepare", "-c", config, *settings(work, MODELS[0], steps), threads=2)
    for name in MODELS[1:]:
        if not (work / name / "prepared").is_dir():
            shutil.copytree(first / "prepared", work / name / "prepared")
    align = ["align", "prepared", "-c", config, *settings(work, "guided", steps)]
    aligned, _ = timed(lambda: mtx(*align, threads=2), repeats=1, warmup=0)

    def both() -> None:
        jobs = []
        for name in MODELS:
            log = open(work / f"{name}.log", "w")
            cmd = [sys.executable, "-m", "mtx", "train", "-c", config, *settings(work, name, steps)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            jobs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        if any(job.wait() for job in jobs):
            raise SystemExit(f"a training run failed: see {work}/*.log")

    trained, _ = timed(both, repeats=1, warmup=0)
    return {"align_prepared_s": round(aligned.best, 1), "train_s": round(trained.best)}


def aer_of(work: Path, links: list[str]) -> dict:
    from mtx.align import aer
    from mtx.align.links import parse_links, read_links

    sources = (work / "gold.de").read_text(encoding="utf-8").splitlines()
    targets = (work / "gold.en").read_text(encoding="utf-8").splitlines()
    gold = read_links(RWTH / "dev.talp", sources, targets, gold=True, one_based=True)
    predicted = [parse_links(line, f"pair {n + 1}")[0] for n, line in enumerate(links)]
    return aer.score(predicted, gold).to_json()


def model_links(work: Path, name: str, layer: int, heads: list[int] | None) -> list[str]:
    """The model's links of the gold pairs (`mtx score --alignments`), read at `layer` and
    `heads` (None: as the checkpoint says)."""
    ckpt = work / name / "checkpoints" / "last.pt"
    extra = ["--set", f"decode.align_layer={layer}"]
    if heads is not None:
        extra += ["--set", f"decode.align_heads=[{','.join(map(str, heads))}]"]
    args = ["--src", str(work / "gold.de"), "--tgt", str(work / "gold.en"), "--alignments"]
    out = mtx("score", "--checkpoint", str(ckpt), *args, *extra, "--device", "cpu", threads=2)
    return [
        line.split("\t")[3] if line.count("\t") >= 3 else "" for line in out.stdout.splitlines()
    ]


def measure(work: Path) -> dict:
    from mtx.align.links import format_links
    from mtx.align.statistical import align_pairs

    train_de = (work / "data" / "train.de").read_text(encoding="utf-8").splitlines()
    train_en = (work / "data" / "train.en").read_text(encoding="utf-8").splitlines()
    took, links = timed(lambda: list(align_pairs(zip(train_de, train_en))), repeats=1, warmup=0)
    eflomal = [format_links(x) for x in links][-200:]
    figures = {"eflomal": aer_of(work, eflomal) | {"seconds": round(took.best)}}
    layers, heads = 3, 4  # configs/multi30k.yaml's decoder
    for name in MODELS:
        rows = {}
        if name == "guided":
            rows["guided head (layer 1, head 0)"] = aer_of(work, model_links(work, name, -2, None))
        for layer in range(layers):
            rows[f"layer {layer}, every head"] = aer_of(work, model_links(work, name, layer, []))
            for h in range(heads):
                rows[f"layer {layer}, head {h}"] = aer_of(work, model_links(work, name, layer, [h]))
        figures[name] = rows
    figures["agreement with eflomal on val"] = agreement(work, train_de, train_en)
    figures["bleu"] = {name: bleu(work, name) for name in MODELS}
    figures["cost"] = cost(work)
    return figures


def agreement(work: Path, train_de: list[str], train_en: list[str]) -> dict:
    """In domain, where no gold exists: each model's links of Multi30k's first 300 validation
    pairs scored against eflomal's (aligned with the training pairs), as if they were gold."""
    from mtx.align import aer
    from mtx.align.links import Alignments
    from mtx.align.statistical import align_pairs

    val = [(work / "data" / f"val.{lang}").read_text(encoding="utf-8").splitlines()[:300]
           for lang in ("de", "en")]  # fmt: skip
    reference = list(align_pairs(zip(train_de + val[0], train_en + val[1])))[-300:]
    truth = Alignments(reference, reference)
    (work / "val300.de").write_text("".join(x + "\n" for x in val[0]), encoding="utf-8")
    (work / "val300.en").write_text("".join(x + "\n" for x in val[1]), encoding="utf-8")
    out = {}
    for name, layer in (("guided", -2), ("unguided", 0), ("unguided", 1), ("unguided", 2)):
        ckpt = work / name / "checkpoints" / "last.pt"
        args = ["--src", str(work / "val300.de"), "--tgt", str(work / "val300.en")]
        got = mtx("score", "--checkpoint", str(ckpt), *args, "--alignments", "--device", "cpu",
                  "--set", f"decode.align_layer={layer}", threads=2).stdout.splitlines()  # fmt: skip
        links = [_links(line) for line in got]
        label = "guided head" if name == "guided" else f"unguided layer {layer}, every head"
        out[label] = aer.score(links, truth).to_json()
    out["eflomal links"] = sum(len(x) for x in reference)
    return out


def _links(score_line: str) -> set:
    from mtx.align.links import parse_links

    fields = score_line.split("\t")
    return parse_links(fields[3] if len(fields) > 3 else "", "pair")[0]


def bleu(work: Path, name: str) -> float:
    ckpt = work / name / "checkpoints" / "last.pt"
    test = work / "data" / "test2016"
    out = mtx("evaluate", "--checkpoint", str(ckpt), "--src", f"{test}.de", "--ref",
              f"{test}.en", "--beam", "4", "--device", "cpu", "--json", threads=2)  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])["bleu"]


def cost(work: Path, ckpt: Path | None = None, lines: list[str] | None = None) -> dict:
    """Translating test2016 (or `lines`) with beam 4, with and without alignments, alternately
    (2 threads), with the guided model (or `ckpt`)."""
    import torch

    from mtx.decode.translator import Translator

    torch.set_num_threads(2)
    ckpt = ckpt or work / "guided" / "checkpoints" / "last.pt"
    if lines is None:
        lines = (work / "data" / "test2016.de").read_text(encoding="utf-8").splitlines()
    tr = Translator.from_checkpoints(ckpt, device="cpu")
    asked = {"plain": tr.options(beam=4), "alignments": tr.options(beam=4, alignments=True)}
    times: dict[str, list[float]] = {"plain": [], "alignments": []}
    outputs: dict[str, list] = {}
    for _ in range(3):  # alternately, one timed call each a round
        for key, options in asked.items():
            took, done = timed(lambda o=options: tr.translate(lines, o), repeats=1, warmup=0)
            times[key].append(took.best)
            outputs[key] = [t.best.tokens for t in done]
    same = outputs["plain"] == outputs["alignments"]
    best = {k: min(v) for k, v in times.items()}
    return {
        "seconds": {k: round(v, 2) for k, v in best.items()},
        "cost": round(best["alignments"] / best["plain"] - 1, 3),
        "same_translations": same,
    }


def train_toys(work: Path, config: str, runs: dict[str, list[str]]) -> None:
    """configs/toy.yaml prepared once, aligned, and trained as each of `runs` says, side by
    side, one thread each (a run whose best.pt exists is kept)."""
    first = work / "toy-prepared"
    if not (first / "prepared").is_dir():
        mtx("prepare", "-c", config, "--set", f"run_dir={first}", threads=2)
        mtx("align", "prepared", "-c", config, "--set", f"run_dir={first}", threads=2)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    jobs = []
    for name, extra in runs.items():
        run = work / f"toy-{name}"
        if (run / "checkpoints" / "best.pt").is_file():
            continue
        shutil.copytree(first / "prepared", run / "prepared", dirs_exist_ok=True)
        cmd = [sys.executable, "-m", "mtx", "train", "-c", config]
        cmd += ["--set", f"run_dir={run}", "--set", "train.threads=1", *extra]
        jobs.append(
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        )
    if any(job.wait() for job in jobs):
        raise SystemExit("a toy training run failed")


def toy_gold(work: Path) -> dict:
    """The aligners on the toy corpus, whose generator says its gold links: eflomal on the
    training and test pairs, configs/toy.yaml trained without guidance, with guidance in the
    translating pass and in a full-context pass, side by side (one thread each), each read in
    several ways (`TOY_READINGS`) and scored on the 500 test pairs."""
    from mtx.align import aer
    from mtx.align.links import Alignments
    from mtx.align.statistical import align_pairs
    from mtx.data import toy

    config = str(ROOT / "configs" / "toy.yaml")
    test, gold = toy.split_pairs("test"), toy.alignments("test")
    truth = Alignments(list(gold), list(gold))
    pairs = toy.split_pairs("train") + test
    took, links = timed(lambda: list(align_pairs(pairs)), repeats=1, warmup=0)
    figures = {"eflomal": aer.score(links[-500:], truth).to_json() | {"seconds": round(took.best)}}
    train_toys(work, config, TOY_RUNS)
    (work / "toy.en").write_text("".join(en + "\n" for en, _ in test), encoding="utf-8")
    (work / "toy.de").write_text("".join(de + "\n" for _, de in test), encoding="utf-8")
    for name in TOY_RUNS:
        ckpt = work / f"toy-{name}" / "checkpoints" / "best.pt"
        rows = {}
        for layer, heads, reading in TOY_READINGS:
            if (name == "unguided") != (heads is not None):
                continue  # a guided model by its own heads, the other by layers and heads
            extra = [
                "--set",
                f"decode.align_layer={layer}",
                "--set",
                f"decode.align_reading={reading}",
            ]
            if heads is not None:
                extra += ["--set", f"decode.align_heads=[{','.join(map(str, heads))}]"]
            out = mtx("score", "--checkpoint", str(ckpt), "--src", str(work / "toy.en"), "--tgt",
                      str(work / "toy.de"), "--alignments", "--device", "cpu", *extra, threads=2)  # fmt: skip
            got = [_links(line) for line in out.stdout.splitlines()]
            label = f"layer {layer}, heads {heads or 'all'}, {reading}"
            if heads is None:
                label = "as trained" if reading == "auto" else f"its guided heads, {reading}"
            rows[label] = aer.score(got, truth).to_json()
        figures[name] = rows
    best = work / "toy-guided-full" / "checkpoints" / "best.pt"
    figures["cost, guided-full"] = cost(work, best, [en for en, _ in test])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("data", "train", "measure", "toy"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/mtx-alignment"))
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    if a.stage == "data":
        return data(a.work)
    stages = {"train": lambda: train(a.work, a.steps), "measure": lambda: measure(a.work)}
    figures = stages.get(a.stage, lambda: toy_gold(a.work))()
    report = result(f"alignment {a.stage}", figures, steps=a.steps)
    print(json.dumps(report, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
