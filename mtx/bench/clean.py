"""`mtx bench clean`: the cleaning rules of `mtx prepare` on a corpus whose noise is known.

    mtx bench clean --out runs/noisy/noisy [--data data/multi30k]
                    [--third train.fr --third train.cs] [--noise 0.333] [--seed 1]
                    [--run-dir runs/noisy/check] [--set KEY=VALUE ...] [--json FILE]

1. Builds a noisy de->en Multi30k training set, OUT.de / OUT.en, with OUT.kind naming each
   line's kind: `clean` (Multi30k's training pairs, all of them) and, making up --noise of
   the whole, in equal shares:
   - `third`: the target (or, one time in four, the source) in a third language: the
     caption of the same image in the --third files, line-aligned with Multi30k's training
     set (its French and Czech captions, multi30k/dataset's data/task1/raw/train.{fr,cs}.gz);
     without --third this kind is left out;
   - `copy`: the German source as the English target, as is or with its case, spacing or
     final punctuation changed;
   - `misaligned`: a source with the target of another pair;
   - `boilerplate`: ten web boilerplate pairs ("All rights reserved.") repeated, in varied
     case and punctuation;
   - `debris`: a clean pair with encoding debris on a side: U+FFFD for its umlauts, an
     unclosed tag, HTML entities or a terminal escape sequence.
2. Runs `mtx prepare` on it (configs/multi30k.yaml's data settings, de->en, with the
   defaults of data.clean and any --set), times it and reads RUN/prepared/dropped.tsv.
3. Reports, for each rule, the pairs it dropped, its precision (the share of them that
   were noise) and its recall (the share of all noise it caught); for each kind of noise
   the share dropped by any rule and by which; how many clean pairs were lost; and each
   rule's cost alone, in seconds per million pairs on one core (in this process).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtx.bench.harness import describe_machine, result
from mtx.checkpoint import Manifest, RunDir
from mtx.data.clean import BATCH, PAIR_RULES, Duplicates, Rules, normalise, pair_key
from mtx.errors import MtxError

BOILERPLATE = [
    ("Alle Rechte vorbehalten.", "All rights reserved."),
    ("Klicken Sie hier, um mehr zu erfahren.", "Click here to learn more."),
    ("Diese Website verwendet Cookies.", "This website uses cookies."),
    ("Zurück zur Startseite", "Back to the home page"),
    ("Melden Sie sich für unseren Newsletter an.", "Sign up for our newsletter."),
    ("Seite nicht gefunden", "Page not found"),
    ("In den Warenkorb legen", "Add to cart"),
    ("Datenschutzerklärung", "Privacy policy"),
    ("Kontaktieren Sie uns", "Contact us"),
    ("Weiterlesen", "Read more"),
]
KINDS = ("third", "copy", "misaligned", "boilerplate", "debris")


@dataclass
class Options:
    out: Path
    data: Path = Path("data/multi30k")
    third: list[Path] = field(default_factory=list)
    noise: float = 1 / 3
    seed: int = 1
    run_dir: Path | None = None
    config: Path = Path("configs/multi30k.yaml")
    sets: list[str] = field(default_factory=list)
    json: Path | None = None
    langid_lines: dict[str, Path] = field(default_factory=dict)  # language -> a file of it


def _vary(rng: random.Random, text: str) -> str:
    """The same text with its case, spacing or final punctuation changed."""
    return rng.choice(
        [text, text.upper(), text.lower(), text.rstrip(".!") + " !", "  " + text.replace(" ", "  ")]
    )


def _debris(rng: random.Random, de: str, en: str, k: int) -> tuple[str, str]:
    if k % 4 == 0:
        bad = "".join("\ufffd" if c in "äöüÄÖÜß" else c for c in de)
        return (bad if bad != de else de.replace(" ", " \ufffd", 1)), en
    if k % 4 == 1:
        return de, f'<div class="caption">{en}'
    if k % 4 == 2:
        return de.replace(" ", "&nbsp;", 2), en.replace(" ", "&nbsp;", 2)
    return f"\x1b[1m{de}\x1b[0m", en


def build(o: Options) -> Counter:
    """OUT.de, OUT.en and OUT.kind; returns the count of each kind."""
    de = (o.data / "train.de").read_text(encoding="utf-8").splitlines()
    en = (o.data / "train.en").read_text(encoding="utf-8").splitlines()
    thirds = [p.read_text(encoding="utf-8").splitlines() for p in o.third]
    for path, lines in zip(o.third, thirds):
        if len(lines) != len(de):
            raise MtxError(
                f"--third {path}: {len(lines)} lines, Multi30k's training set has {len(de)}"
            )
    rng = random.Random(o.seed)
    kinds = [k for k in KINDS if k != "third" or thirds]
    per_kind = int(round(len(de) * o.noise / (1 - o.noise))) // len(kinds)
    rows = [(s, t, "clean") for s, t in zip(de, en)]
    for kind in kinds:
        for k in range(per_kind):
            i, j = rng.randrange(len(de)), rng.randrange(len(de))
            if kind == "third":
                other = thirds[k % len(thirds)][i]
                pair = (other, en[i]) if k % 4 == 3 else (de[i], other)
            elif kind == "copy":
                pair = (de[i], _vary(rng, de[i]) if k % 2 else de[i])
            elif kind == "misaligned":
                pair = (de[i], en[j if j != i else (i + 1) % len(en)])
            elif kind == "boilerplate":
                b_de, b_en = BOILERPLATE[k % len(BOILERPLATE)]
                pair = (_vary(rng, b_de), _vary(rng, b_en))
            else:
                pair = _debris(rng, de[i], en[i], k)
            rows.append((*pair, kind))
    rng.shuffle(rows)
    for suffix, column in (("de", 0), ("en", 1), ("kind", 2)):
        Path(f"{o.out}.{suffix}").write_text(
            "".join(r[column] + "\n" for r in rows), encoding="utf-8"
        )
    return Counter(r[2] for r in rows)


def prepare(o: Options) -> tuple[float, Manifest, dict[int, str]]:
    """`mtx prepare` of OUT (de->en): (its seconds, its manifest, line -> why it was dropped)."""
    run_dir = o.run_dir or o.out.parent / "check"
    sets = [f"run_dir={run_dir}", "data.src_lang=de", "data.tgt_lang=en", f"data.train={o.out}"]
    sets += [f"data.valid={o.data / 'val'}", f"data.test={o.data / 'test2016'}", *o.sets]
    command = [sys.executable, "-m", "mtx", "prepare", "--config", str(o.config)]
    command += [x for s in sets for x in ("--set", s)]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise MtxError(f"mtx prepare failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    prepared = RunDir(Path(run_dir)).data
    why = {}
    with open(prepared.dropped, encoding="utf-8") as f:
        next(f)
        for row in f:
            split, _, line, reason, _ = row.split("\t", 4)
            if split == "train":
                why[int(line)] = reason
    return seconds, Manifest.read(prepared.manifest), why


def rule_table(kinds: list[str], why: dict[int, str]) -> tuple[list[dict], list[dict]]:
    """(per rule: dropped, precision, recall; per kind: pairs, dropped share, by which rule)."""
    noise = sum(k != "clean" for k in kinds)
    by_rule: dict[str, Counter] = {}
    for line, reason in why.items():
        by_rule.setdefault(reason, Counter())[kinds[line - 1]] += 1
    rules = []
    for reason, got in sorted(by_rule.items(), key=lambda x: -sum(x[1].values())):
        total, caught = sum(got.values()), sum(v for k, v in got.items() if k != "clean")
        rules.append({"rule": reason, "dropped": total, "precision": caught / total,
                      "recall": caught / noise if noise else 0.0})  # fmt: skip
    per_kind = []
    for kind, n in Counter(kinds).items():
        hit = Counter(r for line, r in why.items() if kinds[line - 1] == kind)
        per_kind.append({"kind": kind, "pairs": n, "dropped": sum(hit.values()) / n,
                         "by": dict(hit.most_common())})  # fmt: skip
    return rules, per_kind


def rule_costs(pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Seconds per million pairs of each rule alone, and of them all, on one core."""
    from mtx.data.langid import LanguageId

    on = Rules("de", "en")  # every rule at its default
    off = Rules.off("de", "en")
    alone = {r.name: off.replace(**{r.setting: r.default}) for r in PAIR_RULES}
    alone |= {"langid": off.replace(langid=on.langid)}
    alone |= {"all but langid": on.replace(langid=0.0), "all": on}
    lid, costs = LanguageId(), {}
    batches = [list(zip(*pairs[i : i + BATCH])) for i in range(0, len(pairs), BATCH)]
    for name, rules in {"none": off, **alone}.items():
        start = time.perf_counter()
        for src, tgt in batches:  # as mtx prepare's cleaning map calls them
            rules.reasons(list(src), list(tgt), lid if rules.langid else None)
        costs[name] = (time.perf_counter() - start) / len(pairs) * 1e6
    start = time.perf_counter()
    dup = Duplicates()
    for s, t in pairs:
        dup.seen_before(pair_key(normalise(s), normalise(t)))
    costs["duplicate (normalised)"] = (time.perf_counter() - start) / len(pairs) * 1e6
    return {k: v - costs["none"] if k != "none" else v for k, v in costs.items()}


def _identifiers() -> dict:
    """Each language identifier to race: name -> (load it, identify a line as a code)."""
    from mtx.data.langid import LanguageId

    found = {"py3langid": (LanguageId, lambda lid, line: lid.identify(line)[0])}
    try:
        from lingua import LanguageDetectorBuilder
    except ImportError:  # pip install lingua-language-detector to race it too
        return found

    def lingua(low: bool):
        builder = LanguageDetectorBuilder.from_all_languages()
        return (
            (builder.with_low_accuracy_mode() if low else builder)
            .with_preloaded_language_models()
            .build()
        )

    def code(detector, line: str) -> str:
        found = detector.detect_language_of(line)
        return found.iso_code_639_1.name.lower() if found is not None else ""

    found["lingua (high accuracy)"] = (lambda: lingua(False), code)
    found["lingua (low accuracy)"] = (lambda: lingua(True), code)
    return found


def langid_race(files: dict[str, Path]) -> list[dict]:
    """Each identifier's share of lines identified as the language of their file, its lines
    per second (one core, in this process) and its loading time."""
    lines = [(line, lang) for lang, path in files.items()
             for line in path.read_text(encoding="utf-8").splitlines()]  # fmt: skip
    rows = []
    for name, (load, identify) in _identifiers().items():
        start = time.perf_counter()
        model = load()
        loaded = time.perf_counter() - start
        start = time.perf_counter()
        right = sum(identify(model, line) == lang for line, lang in lines)
        seconds = time.perf_counter() - start
        rows.append({"identifier": name, "accuracy": right / len(lines),
                     "lines_per_s": len(lines) / seconds, "load_seconds": loaded})  # fmt: skip
    return rows


def run(o: Options) -> str:
    """`mtx bench clean`: the tables (and the JSON result written to `o.json` if given)."""
    if not (o.data / "train.de").is_file():
        raise MtxError(f"--data: no such file: {o.data / 'train.de'}")
    o.out.parent.mkdir(parents=True, exist_ok=True)
    counts = build(o)
    kinds = Path(f"{o.out}.kind").read_text().splitlines()
    seconds, manifest, why = prepare(o)
    rules, per_kind = rule_table(kinds, why)
    de = Path(f"{o.out}.de").read_text(encoding="utf-8").splitlines()
    en = Path(f"{o.out}.en").read_text(encoding="utf-8").splitlines()
    costs = rule_costs([(" ".join(s.split()), " ".join(t.split())) for s, t in zip(de, en)])
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()}
    settings["third"] = [str(p) for p in o.third]
    settings["langid_lines"] = {k: str(v) for k, v in o.langid_lines.items()}
    report = result(
        "clean",
        {
            "kinds": dict(counts),
            "prepare_seconds": seconds,
            "kept": manifest.splits["train"].kept,
            "dropped": manifest.splits["train"].dropped,
            "rules": rules,
            "by_kind": per_kind,
            "seconds_per_million_pairs": costs,
            "langid": langid_race(o.langid_lines) if o.langid_lines else [],
        },
        **settings,
    )
    if o.json:
        o.json.write_text(json.dumps(report) + "\n")
    return describe(report)


def describe(r: dict) -> str:
    lines = [describe_machine(r["machine"]), f"noise: {r['kinds']}",
             f"mtx prepare: {r['prepare_seconds']:.1f} s, kept {r['kept']}",
             "rule          dropped  precision  recall"]  # fmt: skip
    for x in r["rules"]:
        lines.append(
            f"{x['rule']:<13}{x['dropped']:>8}  {x['precision']:>9.3f}  {x['recall']:>6.3f}"
        )
    lines.append("kind          pairs  dropped  by")
    for x in r["by_kind"]:
        lines.append(f"{x['kind']:<13}{x['pairs']:>6}  {x['dropped']:>7.3f}  {x['by']}")
    for x in r["langid"]:
        lines.append(f"{x['identifier']}: {x['accuracy']:.4f} right, {x['lines_per_s']:.0f} "
                     f"lines/s, loaded in {x['load_seconds']:.1f} s")  # fmt: skip
    lines.append("seconds per million pairs, one core: " + ", ".join(
        f"{k} {v:.1f}" for k, v in r["seconds_per_million_pairs"].items()))  # fmt: skip
    return "\n".join(lines)
