"""Documents and markup (docs/documents.md): sentence splitters and parsers compared, and a
Multi30k German -> English model trained with guided alignment translating tagged sentences,
paragraphs and HTML pages built from test2016.

    python -m benchmarks.documents train --work W --steps 1200   # the model (raw text)
    python -m benchmarks.documents splitters [--json]           # sentencex vs pysbd
    python -m benchmarks.documents parsers [--json]             # lxml vs html5lib, selectolax
    python -m benchmarks.documents markup --work W [--json]      # tags and placeholders
    python -m benchmarks.documents paragraphs --work W [--json]  # paragraphs vs lines
    python -m benchmarks.documents pages --work W [--json]       # 20 HTML pages
    python -m benchmarks.documents plain --old DIR [--checkpoint C] [--json]  # no format

The model: configs/multi30k.yaml's shape, trained on Multi30k's raw text ($M30K, default
../shared/data/multi30k), de -> en, on the CPU, with train.align_weight 0.05 on the first head
of the penultimate decoder layer learning from eflomal's alignments of its prepared data.
Every test set is built from test2016 with a fixed seed. Tag placement is checked against an
independent aligner: eflomal aligns each (source, output) pair, both without tags, together
with Multi30k's training pairs, and a tag's reference is its source words' aligned output
words, first to last. The baseline puts each tag at its relative place in the output. pysbd,
html5lib and selectolax are compared only here (`pip install pysbd html5lib selectolax`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from mtx.bench.harness import ROOT, result, timed

M30K = Path(os.environ.get("M30K", ROOT.parent / "shared" / "data" / "multi30k"))


def mtx(*args: str, threads: int = 2) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "mtx", *map(str, args)]
    return subprocess.run(cmd, check=True, text=True, capture_output=True, env=env)


def settings(work: Path, steps: int) -> list[str]:
    out = [
        f"run_dir={work / 'model'}", "data.src_lang=de", "data.tgt_lang=en",
        f"data.train={M30K / 'train'}", f"data.valid={M30K / 'val'}",
        f"data.test={M30K / 'test2016'}", "train.device=cpu", "train.threads=2",
        f"train.max_steps={steps}", f"train.warmup_steps={max(1, steps // 2)}",
        f"train.valid_every={steps}", "train.bleu_every=0", "train.log_every=100",
        "train.align_weight=0.05", "train.align_layer=-2", "train.align_heads=1",
    ]  # fmt: skip
    return [x for s in out for x in ("--set", s)]


def train(work: Path, steps: int) -> dict:
    """Prepare, align the prepared data, train the guided model."""
    config = ROOT / "configs" / "multi30k.yaml"
    sets = settings(work, steps)
    took, _ = timed(
        lambda: [mtx(cmd, sub, "-c", config, *sets) if sub else mtx(cmd, "-c", config, *sets)
                 for cmd, sub in (("prepare", ""), ("align", "prepared"), ("train", ""))],
        repeats=1, warmup=0,
    )  # fmt: skip
    return {"seconds": round(took.best, 1), "steps": steps}


def checkpoint(work: Path) -> Path:
    return work / "model" / "checkpoints" / "last.pt"


def test_lines(lang: str) -> list[str]:
    return (M30K / f"test2016.{lang}").read_text(encoding="utf-8").splitlines()


def paragraphs_of(lines: list[str], seed: int = 1) -> list[list[str]]:
    """`lines` in consecutive groups of 3 to 6 (the last may be shorter)."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(lines):
        n = rng.randint(3, 6)
        out.append(lines[i : i + n])
        i += n
    return out


def splitters(_args) -> dict:
    """sentencex and pysbd on test2016 and val (both languages) joined into paragraphs: how
    many paragraphs and sentences each finds exactly, and sentences a second."""
    import pysbd
    import sentencex

    out = {}
    for lang in ("de", "en"):
        lines = test_lines(lang) + (M30K / f"val.{lang}").read_text("utf-8").splitlines()
        groups = paragraphs_of(lines)
        seg = pysbd.Segmenter(language=lang, clean=False)
        for name, cut in (
            ("sentencex", lambda t, lang=lang: list(sentencex.segment(lang, t))),
            ("pysbd", seg.segment),
        ):
            # one pass each, no warm-up: sentencex keeps what it has split (a second pass is
            # a lookup)
            took, found = timed(
                lambda cut=cut, groups=groups: [cut(" ".join(g)) for g in groups],
                repeats=1,
                warmup=0,
            )
            found = [[s.strip() for s in f] for f in found]
            out[f"{name}.{lang}"] = {
                "paragraphs_exact": sum(f == g for f, g in zip(found, groups)),
                "paragraphs": len(groups),
                "sentences_found": sum(len(set(f) & set(g)) for f, g in zip(found, groups)),
                "sentences": sum(map(len, groups)),
                "sentences_per_s": round(sum(map(len, groups)) / took.best),
            }
    return out


def pages(n: int = 20, seed: int = 2) -> list[str]:
    """`n` HTML pages of test2016's German text: a title, headings, paragraphs with links and
    bold words, a list, a table, entities, a script and a style block, text not to translate."""
    rng, lines = random.Random(seed), test_lines("de")
    take = iter(rng.sample(range(len(lines)), len(lines)))

    def line() -> str:
        return lines[next(take)]

    def inline(text: str) -> str:
        words = text.split()
        a = rng.randrange(len(words))
        tag = rng.choice(['<a href="/x?a=1&amp;b=2">', "<b>", '<span class="hl">'])
        words[a] = f"{tag}{words[a]}</{tag[1:].split()[0].rstrip('>')}>"
        return " ".join(words)

    out = []
    for k in range(n):
        paragraphs = "\n".join(
            f"<p>{' '.join(inline(line()) for _ in range(rng.randint(2, 4)))}</p>"
            for _ in range(rng.randint(2, 3))
        )
        items = "".join(f"<li>{line()}</li>" for _ in range(rng.randint(3, 5)))
        cells = "".join(f"<tr><td>{line()}</td><td>{line()}</td></tr>" for _ in range(2))
        out.append(
            f'<!DOCTYPE html>\n<html lang="de">\n<head><meta charset="utf-8">'
            f"<title>{line()}</title>\n<style>p > b {{ color: #{k:03d}; }}</style></head>\n"
            f"<body>\n<h1>{line()} &amp; {line()}</h1>\n{paragraphs}\n<ul>{items}</ul>\n"
            f"<table>{cells}</table>\n<p>&copy; 2026&nbsp;&quot;{line()}&quot;</p>\n"
            f'<p translate="no">Seite {k}</p>\n<p>Mit <code>make test</code> prüfen.</p>\n'
            f"<script>if (a < b && c) {{ show({k}); }}</script>\n</body>\n</html>\n"
        )
    return out


def parsers() -> dict:
    """Reading and writing back the 20 pages and the tagged lines: lxml, html5lib and
    selectolax (the candidates for HTML; lxml alone also reads XML)."""
    import html5lib
    import lxml.html
    from selectolax.lexbor import LexborHTMLParser as HTMLParser

    texts = pages() + tagged_set()
    ways = {
        "lxml": lambda t: lxml.html.tostring(lxml.html.document_fromstring(t), encoding="unicode"),
        "html5lib": lambda t: html5lib.serialize(html5lib.parse(t)),
        "selectolax": lambda t: HTMLParser(t).html,
    }
    out = {}
    for name, way in ways.items():
        took, _ = timed(lambda way=way: [way(t) for t in texts], repeats=3)
        out[name] = {"texts_per_s": round(len(texts) / took.best), "xml": name == "lxml"}
    return out


def translator(work: Path, **decode):
    import torch

    from mtx.decode.translator import Translator

    torch.set_num_threads(2)
    return Translator.from_checkpoints(checkpoint(work), device="cpu", decode=decode)


TAGS = [("b", ""), ("i", ""), ("a", ' href="/x?a=1&amp;b=2"'), ("span", ' class="hl"'),
        ("em", ' title="t"')]  # fmt: skip
PLACEHOLDERS = ["{name}", "%s", "%1$s", "$USER", "{{ count }}"]


def tagged_set(seed: int = 3) -> list[str]:
    """test2016's German lines, each with one to three inline elements around random word
    spans (a second one nested in the first where it fits), each numbered (data-k), and half
    of them with a placeholder between two words."""
    rng, out = random.Random(seed), []
    for line in test_lines("de"):
        words = line.split()
        opens, closes = [""] * len(words), [""] * len(words)
        spans: list[tuple[int, int]] = []
        for k in range(rng.randint(1, 3)):
            tag, attrs = rng.choice(TAGS)
            a, b = sorted(rng.sample(range(len(words) + 1), 2)) if len(words) > 1 else (0, 1)
            if spans and rng.random() < 0.5 and spans[0][1] - spans[0][0] > 1:
                a = rng.randrange(*spans[0])  # nested in the first
                b = rng.randrange(a, spans[0][1]) + 1
            elif any(x < b and a < y and not (x <= a and b <= y) for x, y in spans):
                continue  # would cross one already there
            spans.append((a, b))
            opens[a] += f'<{tag}{attrs} data-k="{k}">'
            closes[b - 1] = f"</{tag}>" + closes[b - 1]
        text = [o + w + c for o, w, c in zip(opens, words, closes)]
        if rng.random() < 0.5:
            text.insert(rng.randrange(1, len(text) + 1), rng.choice(PLACEHOLDERS))
        out.append(" ".join(text))
    return out


def marked_words(fragment: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """A fragment's words (placeholders left out) and each numbered element's words [a, b)."""
    import lxml.html

    root = lxml.html.fragment_fromstring(fragment, create_parent="r")
    text, ranges = [], {}

    def walk(node) -> None:
        start = sum(map(len, text))
        text.append(node.text or "")
        for child in node:
            walk(child)
            text.append(child.tail or "")
        if node.get("data-k") is not None:
            ranges[node.get("data-k")] = (start, sum(map(len, text)))

    walk(root)
    joined = "".join(text)
    tokens = [(m.start(), m.end(), m.group()) for m in re.finditer(r"\S+", joined)]
    tokens = [t for t in tokens if t[2] not in PLACEHOLDERS and t[2] not in ("{{", "}}", "count")]
    spans = {}
    for k, (s, e) in ranges.items():
        inside = [i for i, (a, b, _) in enumerate(tokens) if b > s and a < e]
        if inside:
            spans[k] = (inside[0], inside[-1] + 1)
    return [t[2] for t in tokens], spans


def markup(args) -> dict:
    """The tagged set translated (html): parses, elements, placeholders, tag placement
    against eflomal's projection and the relative-place baseline, BLEU without tags."""
    import lxml.html

    from mtx.align.statistical import align_pairs
    from mtx.evaluate import score

    sources = tagged_set()
    tr = translator(args.work, format="html")
    took, done = timed(lambda: tr.translate(sources), repeats=1, warmup=0)
    outputs = [t.best.text for t in done]
    plain_took, plain = timed(lambda: translator(args.work).translate(test_lines("de")),
                              repeats=1, warmup=0)  # fmt: skip
    ok = sum(_same_elements(x, y) for x, y in zip(sources, outputs))
    kept = sum(
        all(y.count(p) == x.count(p) for p in PLACEHOLDERS) for x, y in zip(sources, outputs)
    )
    pairs = [(marked_words(x), marked_words(y)) for x, y in zip(sources, outputs)]
    train = zip(*(open(M30K / f"train.{lang}", encoding="utf-8") for lang in ("de", "en")))
    links = list(align_pairs([*train, *((" ".join(a[0]), " ".join(b[0])) for a, b in pairs)]))
    placement = _placement(pairs, links[-len(pairs) :])
    detagged = [" ".join(lxml.html.fragment_fromstring(y, create_parent="r").text_content()
                         .split()) for y in outputs]  # fmt: skip
    detagged = [" ".join(functools.reduce(lambda t, p: t.replace(p, " "), PLACEHOLDERS, y)
                         .split()) for y in detagged]  # fmt: skip
    refs = test_lines("en")
    return {
        "lines": len(sources), "parse_and_same_elements": ok, "placeholders_kept": kept,
        **placement, "bleu_tags_removed": score(detagged, refs).bleu,
        "text_equal_to_untagged": sum(x == " ".join(y.split()) for x, y in zip(detagged, plain)),
        "bleu_untagged": score(plain, refs).bleu,
        "seconds": {"tagged": round(took.best, 2), "untagged": round(plain_took.best, 2)},
    }  # fmt: skip


def _same_elements(source: str, output: str) -> bool:
    import lxml.html

    def of(text):
        root = lxml.html.fragment_fromstring(text, create_parent="r")
        return sorted((n.tag, sorted(n.attrib.items())) for n in list(root.iter())[1:])

    try:
        return of(source) == of(output)
    except Exception:  # noqa: BLE001 - not parsing is what is counted
        return False


def _placement(pairs, links) -> dict:
    """Tags whose output words equal the projection of their source words by eflomal's links
    (first to last aligned word), for mtx and for the relative-place baseline."""
    agree = base = counted = unaligned = 0
    for ((src, spans), (out, placed)), found in zip(pairs, links):
        n, m = len(src), len(out)
        for k, (a, b) in spans.items():
            js = [j for i, j in found if a <= i < b]
            if not js:
                unaligned += 1
                continue
            reference = (min(js), max(js) + 1)
            counted += 1
            agree += placed.get(k) == reference
            s = min(m - 1, a * m // n)
            base += (s, min(m, max(s + 1, round(b * m / n)))) == reference
    return {
        "tags_compared": counted, "tags_unaligned_by_eflomal": unaligned,
        "placement_mtx": round(100 * agree / counted, 2),
        "placement_relative_baseline": round(100 * base / counted, 2),
    }  # fmt: skip


def paragraphs(args) -> dict:
    """test2016 in paragraphs of 3 to 6 sentences: translated as paragraphs (split again by
    sentencex) and line by line, alternately three times each; BLEU on the paragraphs."""
    from mtx.documents.sentences import split
    from mtx.evaluate import score

    groups = paragraphs_of(test_lines("de"))
    texts = [" ".join(g) for g in groups]
    lines_tr, para_tr = translator(args.work), translator(args.work, format="paragraphs")
    times: dict[str, list[float]] = {"lines": [], "paragraphs": []}
    for _ in range(3):
        took, by_line = timed(lambda: lines_tr.translate(test_lines("de")), repeats=1, warmup=0)
        times["lines"].append(took.best)
        took, done = timed(lambda: para_tr.translate(texts), repeats=1, warmup=0)
        times["paragraphs"].append(took.best)
    it = iter(t.best.text for t in by_line)
    joined = [" ".join(next(it) for _ in g) for g in groups]
    refs = [" ".join(g) for g in paragraphs_of(test_lines("en"))]
    best = {k: min(v) for k, v in times.items()}
    return {
        "paragraphs": len(groups),
        "split_exactly": sum(len(split(t, "de")) == len(g) for t, g in zip(texts, groups)),
        "bleu_paragraphs": score([t.best.text for t in done], refs).bleu,
        "bleu_line_by_line": score(joined, refs).bleu,
        "seconds": {k: round(v, 2) for k, v in best.items()},
        "speed_vs_lines": round(best["lines"] / best["paragraphs"], 3),
    }


def html_pages(args) -> dict:
    """20 pages translated whole: they parse, every block with words comes back translated
    (or kept, where marked), the script and style byte for byte."""
    import lxml.html

    built = pages()
    tr = translator(args.work, format="html")
    took, done = timed(lambda: tr.translate(built), repeats=1, warmup=0)
    out = [t.best.text for t in done]
    checks = {"pages": len(built), "parse": 0, "same_text_blocks": 0, "blocks_translated": 0,
              "blocks_kept": 0, "blocks": 0, "script_and_style_identical": 0,
              "kept_identical": 0}  # fmt: skip
    for source, page in zip(built, out):
        root = lxml.html.document_fromstring(page)
        checks["parse"] += root is not None and root.find("body") is not None
        a, b = _text_blocks(source), _text_blocks(page)
        checks["same_text_blocks"] += len(a) == len(b)
        checks["blocks"] += len(a)
        kept = re.compile(r"Seite \d+")  # the block marked translate="no"
        checks["blocks_translated"] += sum(x != y for x, y in zip(a, b) if not kept.fullmatch(x))
        checks["blocks_kept"] += sum(x == y for x, y in zip(a, b) if kept.fullmatch(x))
        blocks = re.compile(r"<script>.*?</script>|<style>.*?</style>", re.S)
        checks["script_and_style_identical"] += blocks.findall(source) == blocks.findall(page)
        checks["kept_identical"] += (
            '<p translate="no">Seite' in page and "<code>make test</code>" in page
        )
    return {**checks, "seconds": round(took.best, 2)}


def _text_blocks(page: str) -> list[str]:
    """The text of each block element that holds words of its own (not script or style)."""
    import lxml.html

    root = lxml.html.document_fromstring(page)
    blocks = ("title", "h1", "p", "li", "td")
    return [" ".join(e.text_content().split()) for e in root.iter(*blocks)
            if e.text_content().split()]  # fmt: skip


def plain(args) -> dict:
    """test2016 with no format, beam 4, by this checkout and by `--old`, in subprocesses,
    alternately three times each: the same output, and the time of each."""
    src = M30K / "test2016.de"
    times: dict[str, list[float]] = {"old": [], "new": []}
    outs = {}
    for _ in range(3):
        for name, path in (("old", args.old), ("new", ROOT)):
            # `python -m mtx` run in a checkout imports that checkout's mtx (the working
            # directory comes first on the module path)
            env = dict(os.environ, OMP_NUM_THREADS="2")
            model = args.checkpoint or checkpoint(args.work)
            cmd = [sys.executable, "-m", "mtx", "translate", "--checkpoint", str(model),
                   "--device", "cpu", "--beam", "4"]  # fmt: skip
            took, done = timed(lambda cmd=cmd, env=env, path=path: subprocess.run(
                cmd, stdin=open(src, "rb"), capture_output=True, check=True, env=env, cwd=path
            ), repeats=1, warmup=0)  # fmt: skip
            times[name].append(took.best)
            outs[name] = done.stdout
    return {
        "identical": outs["old"] == outs["new"],
        "seconds": {k: round(min(v), 2) for k, v in times.items()},
        "speed_new_vs_old": round(min(times["old"]) / min(times["new"]), 3),
    }


STAGES = {
    "train": lambda a: train(a.work, a.steps),
    "splitters": splitters,
    "parsers": lambda a: parsers(),
    "markup": markup,
    "paragraphs": paragraphs,
    "pages": html_pages,
    "plain": plain,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/mtx-documents"))
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--old", type=Path, help="plain: a checkout of the code before")
    parser.add_argument(
        "--checkpoint", type=Path, help="plain: a model the old code reads (default W's)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    figures = STAGES[args.stage](args)
    out = result(f"documents-{args.stage}", figures, work=str(args.work))
    print(json.dumps(out, indent=1) if args.json else json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
