"""Steered translation on a Multi30k model: target prefixes, constraints drawn from the
reference, a glossary learnt from the training corpus (docs/decoding.md, "Steering a
translation").

    python -m benchmarks.controls --checkpoint CKPT [--lines 1000] [--threads 2] [--json]

On test2016 (en->de; $M30K, default data/multi30k) with beam 4:

- prefixes: the first 1, 2 and 3 reference words as each line's prefix; how many outputs begin
  with it, and the BLEU of the continuations (the prefix's words removed from output and
  reference) against that of the unsteered outputs' words past the same point;
- constraints as Post and Vilar (2018) draw them: one and two random reference phrases of 1-3
  words a line (seed 1); the share of the constraints that fit their line's longest output
  that the output contains (its ids, and its words), BLEU against unconstrained, and the speed
  of constrained beam 4 against unconstrained beam 4 on the same lines and batches (each timed
  twice, alternately, in this process; the best of each);
- alternatives: 4 after each line's first reference word, against beam 4 with that prefix:
  that each begins with the prefix and a distinct next word, the decoder's rows and steps,
  and the cost (each timed three times, alternately; the best of each);
- a glossary: mtx's lexical table (data/lexical.py) learnt on the training pairs; each test
  source word whose best translation is a mutual best (the target word's best translation is
  that source word), a content word (in at most 1% of the training pairs) whose translation
  follows it in at least 80% of them, which the reference holds and the unsteered output
  lacks, gives a term, written as the training targets most often write it (German nouns
  capitalised); term accuracy (the share of the glossary's hits in the sources whose
  target term the output holds) and BLEU, without and with it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import torch

from mtx.bench.harness import ROOT, result
from mtx.decode.controls import fits

M30K = Path(os.environ.get("M30K", ROOT / "data" / "multi30k"))  # mtx fetch multi30k
SEED = 1


def lines_of(path: Path, n: int) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[:n]


def decode(translator, items: list) -> tuple[list, float]:
    """The outputs of every item (a string or a `Line`), best first, and the seconds it took."""
    start = time.perf_counter()
    done = translator.translate(items)
    return [t.outputs for t in done], time.perf_counter() - start


def texts(translator, hyps) -> list[str]:
    return [h[0].text for h in hyps]


def longest(tr, item) -> int:
    """An item's longest output, EOS included (decode.max_len_a/b, the model's limit)."""
    d, limit = tr.parts.config.decode, tr.parts.model.max_positions - 1
    return tr.requests([item])[0].longest(d.max_len_a, d.max_len_b, limit)


def prefixes(tr, sources, refs, plain_out) -> dict:
    from mtx.decode.controls import Controls, Line
    from mtx.evaluate import score

    out = {}
    for n in (1, 2, 3):
        rows = [i for i, r in enumerate(refs) if len(r.split()) > n]
        items = [Line(sources[i], Controls(prefix=" ".join(refs[i].split()[:n]))) for i in rows]
        hyps, _ = decode(tr, items)
        got = texts(tr, hyps)
        begins = sum(g.startswith(x.controls.prefix) for g, x in zip(got, items))
        rest = [" ".join(g.split()[n:]) for g in got]
        ref_rest = [" ".join(refs[i].split()[n:]) for i in rows]
        plain_rest = [" ".join(plain_out[i].split()[n:]) for i in rows]
        out[n] = {
            "lines": len(rows),
            "begin_with_prefix": begins,
            "bleu_continuation": score(rest, ref_rest).bleu,
            "bleu_unsteered_same_words": score(plain_rest, ref_rest).bleu,
        }
    return out


def counted(tr, items: list) -> tuple[tuple[list, float], list[int]]:
    """`decode`, and the rows and the steps the model's decoder ran (summed over batches)."""
    model = tr.parts.model
    work, plain = [0, 0], model.decode

    def decode_counting(last, *args):
        work[0], work[1] = work[0] + last.size(0), work[1] + 1
        return plain(last, *args)

    model.decode = decode_counting
    try:
        return decode(tr, items), work
    finally:
        del model.decode  # the class's again


def alternatives(tr, sources, refs) -> dict:
    """4 alternatives after each line's first reference word, against beam 4 with that
    prefix: their cost, and that each begins with the prefix and a distinct next word."""
    from mtx.decode.controls import Controls, Line

    prefix = [" ".join(r.split()[:1]) for r in refs]
    asked = [Line(s, Controls(prefix=p, alternatives=4)) for s, p in zip(sources, prefix)]
    beam = [Line(s, Controls(prefix=p)) for s, p in zip(sources, prefix)]
    (hyps, seconds), work = counted(tr, asked)
    (beam_hyps, beam_s), beam_work = counted(tr, beam)
    times, beam_times = [seconds], [beam_s]
    for _ in range(2):  # three rounds each, alternately: the best of each
        times.append(decode(tr, asked)[1])
        beam_times.append(decode(tr, beam)[1])
    ok = sum(
        len(h) == 4
        and all(x.text.startswith(p) for x in h)
        and len({tuple(x.tokens[: len(tr.requests([a])[0].controls.prefix) + 1]) for x in h}) == 4
        for h, p, a in zip(hyps, prefix, asked)
    )
    best, best_beam = min(times), min(beam_times)
    limits = [longest(tr, a) for a in asked]

    def at_limit(found) -> int:  # lines with a hypothesis at its longest output (EOS counted)
        return sum(max(len(x.tokens) + 1 for x in h) >= n for h, n in zip(found, limits))

    return {
        "lines": len(asked),
        "four_distinct_alternatives": ok,
        # a batch runs until its last row is done: a greedy continuation that runs to its
        # longest output keeps it going on a few rows
        "lines_reaching_the_limit": at_limit(hyps),
        "lines_reaching_the_limit_beam4": at_limit(beam_hyps),
        "decoder_rows_steps": work,
        "decoder_rows_steps_beam4": beam_work,
        "seconds": round(best, 2),
        "seconds_beam4_prefix": round(best_beam, 2),
        "cost_vs_beam4": round(best / best_beam, 3),
    }


def reference_phrases(refs: list[str], count: int) -> list[tuple[str, ...]]:
    """`count` random phrases of 1-3 words of each reference, not overlapping (seed SEED)."""
    rng = random.Random(SEED)
    out = []
    for ref in refs:
        words, taken, phrases = ref.split(), set(), []
        for _ in range(count):
            n = rng.randint(1, 3)
            starts = [s for s in range(len(words) - n + 1) if not taken & set(range(s, s + n))]
            if not starts:
                break
            s = rng.choice(starts)
            taken |= set(range(s, s + n))
            phrases.append(" ".join(words[s : s + n]))
        out.append(tuple(phrases))
    return out


def constraints(tr, sources, refs, plain_out, plain_s) -> dict:
    from mtx.decode.controls import Controls, Line
    from mtx.decode.glossary import contains
    from mtx.evaluate import score

    out = {}
    for count in (1, 2):
        items = [
            Line(s, Controls(constraints=p))
            for s, p in zip(sources, reference_phrases(refs, count))
        ]
        hyps, seconds = decode(tr, items)
        _, again = decode(tr, sources)  # unconstrained, alternately
        _, seconds2 = decode(tr, items)
        got = texts(tr, hyps)
        fit = met = words = total = 0
        for x, h, g in zip(items, hyps, got):
            request = tr.requests([x])[0]
            total += len(request.controls.constraints)
            if fits(request.controls, longest(tr, x)):
                fit += len(request.controls.constraints)
                met += len(request.controls.constraints) - h[0].unmet
                words += sum(contains(g, c) for c in x.controls.constraints)
        plain_best = min(plain_s, again)
        best = min(seconds, seconds2)
        out[count] = {
            "constraints": total,
            "fit": fit,
            "met_of_fit": met,
            "in_words_of_fit": words,
            "bleu": score(got, refs).bleu,
            "bleu_unconstrained": score(plain_out, refs).bleu,
            "seconds": round(best, 2),
            "seconds_unconstrained": round(plain_best, 2),
            "speed_vs_unconstrained": round(plain_best / best, 3),
        }
    return out


def glossary(tr, sources, refs, plain_out, path: Path) -> dict:
    import pyarrow as pa

    from mtx.data.lexical import Table
    from mtx.decode.controls import Line
    from mtx.decode.glossary import WORD, Glossary, Report, words
    from mtx.evaluate import score

    train_src = (M30K / "train.en").read_text(encoding="utf-8").splitlines()
    train_tgt = (M30K / "train.de").read_text(encoding="utf-8").splitlines()
    table = Table.learn(pa.array(train_src), pa.array(train_tgt))
    src_vocab, tgt_vocab = table.src_vocab.to_pylist(), table.tgt_vocab.to_pylist()
    (indptr, indices), back = table.forward, table.backward
    best = {}  # source word -> its best translation, where each is the other's best
    for i, w in enumerate(src_vocab):
        if indptr[i] < indptr[i + 1]:
            j = indices[indptr[i]]
            if back[0][j] < back[0][j + 1] and back[1][back[0][j]] == i:
                best[w] = tgt_vocab[j]
    wanted = {w: {t} for w, t in best.items()}
    pairs, count, both, spelt = len(train_src), Counter(), Counter(), Counter()
    for x, y in zip(train_src, train_tgt):
        xs, ys = set(words(x)), set(words(y))
        count.update(xs)
        spelt.update(WORD.findall(y))
        both.update((a, b) for a in xs for b in ys if b in wanted.get(a, ()))
    spelling = {}  # the table's words are casefolded: a term is written as the corpus writes it
    for form, _ in spelt.most_common():
        spelling.setdefault(form.casefold(), form)
    terms: dict[str, str] = {}
    for s, r, o in zip(sources, refs, plain_out):
        ref_words, out_words = set(words(r)), set(words(o))
        for w in set(words(s)) & set(best):
            t = best[w]
            # a content word (in at most 1% of the pairs) whose best translation follows it in
            # at least 80% of the training pairs
            precise = count[w] <= pairs / 100 and both[w, t] >= 0.8 * count[w]
            if precise and t in ref_words and t not in out_words:
                terms[w] = spelling[t]
    path.write_text("".join(f"{s}\t{t}\n" for s, t in sorted(terms.items())), encoding="utf-8")
    gloss = Glossary.load(path)
    items = [gloss.apply(Line(s), f"line {i + 1}") for i, s in enumerate(sources)]
    before, after = Report(), Report()
    hyps, _ = decode(tr, items)
    got = texts(tr, hyps)
    for x, h, g, p in zip(items, hyps, got, plain_out):
        before.add(x, p, 0)
        after.add(x, g, h[0].unmet)
    return {
        "terms": len(terms),
        "hits": after.terms,
        "lines_with_terms": sum(bool(x.terms) for x in items),
        "accuracy_unsteered": round(100 * before.honoured / max(before.terms, 1), 2),
        "accuracy": round(100 * after.honoured / max(after.terms, 1), 2),
        "bleu_unsteered": score(plain_out, refs).bleu,
        "bleu": score(got, refs).bleu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mtx-controls"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from mtx.decode.translator import Translator

    tr = Translator.from_checkpoints(args.checkpoint, ["decode.beam=4"], "cpu")
    sources = lines_of(M30K / "test2016.en", args.lines)
    refs = lines_of(M30K / "test2016.de", args.lines)
    decode(tr, sources[:50])  # warm-up
    plain, plain_s = decode(tr, sources)
    plain_out = texts(tr, plain)
    args.work.mkdir(parents=True, exist_ok=True)
    figures = {
        "prefix": prefixes(tr, sources, refs, plain_out),
        "constraints": constraints(tr, sources, refs, plain_out, plain_s),
        "alternatives": alternatives(tr, sources, refs),
        "glossary": glossary(tr, sources, refs, plain_out, args.work / "glossary.tsv"),
    }
    out = result("controls", figures, checkpoint=str(args.checkpoint), lines=args.lines,
                 threads=args.threads, beam=4)  # fmt: skip
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
