"""Decoding speed race: mtx against Hugging Face MarianMT and CTranslate2 on the same weights.

    mtx bench decode --checkpoint RUN/checkpoints/best.pt [--checkpoint OTHER.pt] \
        --src data/multi30k/test2016.en [--ref ...test2016.de] [--batch 32] \
        [--beam 4 --beam 1] [--threads 2] [--device cpu] [--dtype fp32] [--lines N] \
        [--rounds 2] [--stopping k_finished|exact] [--engines mtx,hf,...] [--json]

The checkpoint is exported both ways into a temporary directory (`mtx export`). Every engine
then translates the same batches of pre-encoded sentences (at most --batch sentences of one
source length, see peers.py; or, with --batch-tokens N, the mtx engines alone, each in
`mtx translate`'s own batches: the lines sorted by length into batches of N padded source
tokens, lengths mixed, as `decode.batch_tokens` N) with the same beam, alpha 0 and mtx's
length limit, so that the engines do the same work and should give the same output. Each
engine runs in a process of its own, so that no other engine's thread pool competes for the
cores (in one process, the peers' idle threads were seen to halve mtx's greedy speed). Timed: the search only (not
tokenization), after one warm-up batch, --rounds times, every other round in the reverse order
of engines, so that a busy spell on a shared machine slows every engine alike (the harness's
timer; the fastest round counts, and the spread of the rounds is reported). Reported per
engine and beam: seconds, sentences/s, output tokens/s (EOS not counted, each engine's own
outputs), sacreBLEU against --ref (by default the source file with the target language's
suffix, where it exists) and the share of lines equal to mtx's output. Engines: mtx, mtx-int8 (`decode.dtype=int8`, CPU only), Hugging
Face, CTranslate2 and CTranslate2 int8; named in --engines, mtx-static and mtx-graphs (mtx with
`decode.search` static and graphs, decode/static.py; graphs on CUDA only), mtx-shortlist and
mtx-int8-shortlist (through --shortlist), mtx-draft and mtx-int8-draft (speculative greedy
search with the draft model of --draft, --draft-tokens a call: beam 1 only; the table adds
the share of drafted tokens accepted and how many a call) and mtx-adaptive-draft (the same
with decode.draft_adaptive: as many drafts a call, none included, as have run fastest for the
batch size, up to --draft-tokens; the table adds how many batches each draft length decoded).

Several --checkpoint (a student and its teacher, say) race in the same rounds, on the same
batches (they must share the SentencePiece model), each engine with each checkpoint, and each
checkpoint's speed is also given as a ratio to the first's with the same engine and beam. An
engine whose export cannot hold a checkpoint's model (an SSRU decoder) is left out for it, and
the table says so.

Stopping: Hugging Face (early_stopping=True) ends a sentence's beam search when K hypotheses
have ended, as mtx's default `k_finished` does; CTranslate2 ends it as soon as its best
candidate ends. At alpha 0 a live hypothesis's score can only fall, so that is when mtx's
`--stopping exact` ends it too: compare mtx with CTranslate2 at `--stopping exact`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sacrebleu
import torch

from mtx.bench.harness import Timing, describe_machine, result, timed
from mtx.bench.peers import batches, ct2_generate, hf_generate
from mtx.data import vocab
from mtx.data.batching import pad
from mtx.data.sources import read_lines
from mtx.decode import rules
from mtx.decode.speculative import DraftStats
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.formats import export

ENGINES = ("mtx", "mtx-int8", "hf", "ct2", "ct2-int8")
# mtx's other searches (decode.search), raced when --engines names them: mtx-static (fixed
# rows over a preallocated cache) and mtx-graphs (the same, each step a CUDA graph)
SEARCHES = {"mtx": "shrinking", "mtx-int8": "shrinking", "mtx-static": "static"}
SEARCHES["mtx-graphs"] = "graphs"
# mtx and mtx-int8 through the lexical shortlist of --shortlist (decode.shortlist)
SEARCHES |= {"mtx-shortlist": "shrinking", "mtx-int8-shortlist": "shrinking"}
# mtx and mtx-int8 with the drafts of --draft (decode.draft: speculative greedy search, beam 1)
SEARCHES |= {"mtx-draft": "shrinking", "mtx-int8-draft": "shrinking"}
# mtx with the drafts of --draft and decode.draft_adaptive: as many a call as run fastest
SEARCHES["mtx-adaptive-draft"] = "shrinking"
# --dtype: torch's dtype (mtx, Hugging Face) and CTranslate2's compute type (its int8 engine
# keeps int8 weights and computes the rest in this type)
DTYPES = {
    "fp32": (torch.float32, "float32", "int8_float32"),
    "bf16": (torch.bfloat16, "bfloat16", "int8_bfloat16"),
    "fp16": (torch.float16, "float16", "int8_float16"),
}
# what each mtx engine is raced with
PEERS = {"mtx": ("hf", "ct2"), "mtx-int8": ("ct2-int8",), "mtx-static": ("mtx",)}
PEERS["mtx-graphs"] = ("mtx", "ct2")
PEERS |= {"mtx-shortlist": ("mtx",), "mtx-int8-shortlist": ("mtx-int8",)}
PEERS |= {"mtx-draft": ("mtx",), "mtx-int8-draft": ("mtx-int8",)}
PEERS["mtx-adaptive-draft"] = ("mtx", "mtx-draft")


@dataclass
class Options:
    """What `mtx bench decode` is asked for (its flags)."""

    checkpoints: list[Path]  # the first is the one the others are compared with
    src: Path  # source sentences, one per line
    ref: Path | None = None  # reference translations, for BLEU (default: beside --src)
    lines: int = 0  # only the first N lines (0: all)
    batch: int = 32  # sentences per batch
    batch_tokens: int = 0  # mtx engines only, in `mtx translate`'s batches of this many tokens
    beams: list[int] = field(default_factory=lambda: [4, 1])
    threads: int = 2  # CPU threads of every engine
    device: str = "cpu"
    dtype: str = "fp32"  # every engine's (DTYPES)
    engines: str = ",".join(ENGINES)  # comma-separated
    rounds: int = 2  # timed runs per engine: the fastest counts
    stopping: str = "k_finished"  # mtx's decode.stopping
    json: bool = False  # print the harness's JSON result instead of the table
    shortlist: Path | None = None  # the mtx-*-shortlist engines' decode.shortlist
    draft: Path | None = None  # the mtx-*-draft engines' decode.draft
    draft_tokens: int = 4  # their decode.draft_tokens

    @classmethod
    def from_json(cls, values: dict) -> Options:
        names = ("src", "ref", "shortlist", "draft")
        paths = {k: Path(values[k]) if values[k] else None for k in names}
        return cls(**(values | paths | {"checkpoints": [Path(p) for p in values["checkpoints"]]}))

    def to_json(self) -> dict:
        out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        return out | {"checkpoints": [str(p) for p in self.checkpoints]}


def mtx_runner(name: str, o: Options, model: int, plan, ids):
    """`runner` of an mtx engine (SEARCHES): its function, inputs and dtype's name."""
    int8 = name.startswith("mtx-int8")
    dtype = "int8" if int8 else o.dtype
    sets = ["decode.alpha=0", f"decode.dtype={dtype}", f"decode.stopping={o.stopping}"]
    sets.append(f"decode.search={SEARCHES[name]}")
    if name.endswith("-shortlist"):
        sets.append(f"decode.shortlist={o.shortlist}")
    if name.endswith("-draft"):
        sets += ["decode.beam=1", f"decode.draft={o.draft}"]
        sets.append(f"decode.draft_tokens={o.draft_tokens}")
        sets.append(f"decode.draft_adaptive={'true' if 'adaptive' in name else 'false'}")
    if o.batch_tokens:
        sets.append(f"decode.batch_tokens={o.batch_tokens}")
    # without --batch-tokens, each batch of the plan is decoded as one batch
    sets.append(f"decode.batch_tokens={o.batch_tokens or 1 << 30}")
    tr = Translator.from_checkpoints(o.checkpoints[model], sets, device=o.device)
    asked = {beam: tr.options(beam=beam) for beam in o.beams}  # drafts where given: beam 1

    def run_mtx(sources, limit, beam):
        return [list(t.best.tokens) for t in tr.translate(sources, asked[beam])]

    run_mtx.stats = tr.stats.drafts  # what the drafts were worth (-draft engines)
    inputs = [([ids[i] for i in idx], limit) for limit, idx in plan]
    dtype = next(tr.parts.model.parameters()).dtype
    return run_mtx, inputs, "int8" if int8 else str(dtype)[6:]


def runner(name: str, o: Options, work_dir: Path, work: dict, model: int):
    """The function that runs one batch in engine `name` with checkpoint number `model`, its
    batches and its dtype. `work`: the batches as (limit, line indices), and every line's mtx
    ids and SentencePiece pieces; `work_dir` holds the exports (MODEL/ENGINE)."""
    plan, ids, pieces = work["plan"], work["ids"], work["pieces"]
    origin, never = work["origin"], work["never"]  # the vocabulary's (an imported model's)
    srcs = [(pad([ids[i] for i in idx]), limit) for limit, idx in plan]
    torch_dtype, ct2_type, ct2_int8_type = DTYPES[o.dtype]
    if name in SEARCHES:
        return mtx_runner(name, o, model, plan, ids)
    if name == "hf":
        from transformers import MarianMTModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # not a warning for every batch
        hf = MarianMTModel.from_pretrained(work_dir / str(model) / "hf")
        hf = hf.to(o.device, torch_dtype).eval()

        def run_hf(src, limit, beam):
            return hf_generate(hf, src.to(o.device), limit, beam, origin, never)

        return run_hf, srcs, str(hf.dtype).removeprefix("torch.")
    import ctranslate2

    model = ctranslate2.Translator(
        str(work_dir / str(model) / name),
        device=o.device,
        intra_threads=o.threads,
        compute_type=ct2_type if name == "ct2" else ct2_int8_type,
    )
    vocabulary = vocab.load((work_dir / "spm.model").read_bytes())

    def run_ct2(batch, limit, beam):
        return [ids for ids, _ in ct2_generate(model, vocabulary, batch, limit, beam, never)]

    return run_ct2, [([pieces[i] for i in idx], limit) for limit, idx in plan], model.compute_type


def worker(work_dir: Path, name: str, model: int) -> None:
    """Engine `name` with checkpoint number `model` in a process of its own, with no other
    engine's threads beside it (the CTranslate2 process runs no torch model): every beam timed
    once by the harness after one warm-up batch, the seconds and outputs written to
    WORK_DIR/MODEL-NAME.json. `work_dir` holds the options, the work (work.json) and the
    exports."""
    o = Options.from_json(json.loads((work_dir / "options.json").read_text()))
    torch.set_num_threads(o.threads)
    work = json.loads((work_dir / "work.json").read_text())
    run, inputs, dtype = runner(name, o, work_dir, work, model)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    report = {"dtype": dtype, "beams": {}}
    drafts = run.stats if name.endswith("-draft") else None
    for beam in o.beams if drafts is None else [b for b in o.beams if b == 1]:
        batches = [(*x, beam) for x in inputs]
        run(*batches[0])  # warm-up
        if drafts is not None:
            drafts.reset()  # the timed run's alone
        timing, outputs = timed(
            lambda b=batches: [ids for batch in b for ids in run(*batch)], 1, 0, sync
        )
        report["beams"][str(beam)] = {"seconds": timing.median, "outputs": outputs}
        if drafts is not None:
            report["beams"][str(beam)]["drafts"] = drafts.to_json()
    (work_dir / f"{model}-{name}.json").write_text(json.dumps(report))


EXPORTS = {"hf": ("hf", None), "ct2": ("ctranslate2", None), "ct2-int8": ("ctranslate2", "int8")}


def exported(
    o: Options, engines: list[str], tmp: Path, nllb: bool = False
) -> tuple[list[tuple[int, str]], list]:
    """Each checkpoint's exports for the peers' engines, into TMP/MODEL/ENGINE: the (model,
    engine) pairs to race and the reasons of those left out (an export refused; `nllb`, the
    models' vocabulary is an NLLB model's: the peers' runners give no target-language code)."""
    runs, left_out = [], []
    for model, checkpoint in enumerate(o.checkpoints):
        for name in engines:
            if name in EXPORTS and nllb:
                left_out.append(f"{name}: {checkpoint}: an NLLB model is raced by mtx alone")
                continue
            if name in EXPORTS:
                fmt, quantization = EXPORTS[name]
                try:
                    export(checkpoint, fmt, tmp / str(model) / name, quantization)
                except MtxError as e:  # it names the checkpoint
                    left_out.append(f"{name}: {e}")
                    continue
            runs.append((model, name))
    return runs, left_out


@dataclass
class Raced:
    """What the rounds gave, keyed by (checkpoint number, engine[, beam])."""

    seconds: dict[tuple[int, str, int], list[float]]  # of each round
    outputs: dict[tuple[int, str, int], list[list[int]]]  # the first round's
    dtypes: dict[tuple[int, str], str]  # each engine's, in the order raced
    drafts: dict[tuple[int, str, int], dict]  # a -draft engine's DraftStats, the last round's
    left_out: list[str]  # the engines an export refused, and why


def race(o: Options, engines: list[str], tr: Translator, lines: list[str], plan) -> Raced:
    """Every engine's rounds with every checkpoint, each in a process of its own."""
    seconds: dict[tuple[int, str, int], list[float]] = {}
    outputs: dict[tuple[int, str, int], list[list[int]]] = {}
    dtypes: dict[tuple[int, str], str] = {}
    drafts: dict[tuple[int, str, int], dict] = {}
    codec = tr.parts.codec
    with tempfile.TemporaryDirectory() as tmp:
        work = {
            "plan": plan,
            "ids": [codec.encode(line) for line in lines],
            "origin": codec.vocab.origin,
            "never": rules.never_produced(tr.parts.model.specials),
            "pieces": [list(map(codec.piece, codec.vocab.source.encode(x))) for x in lines],
        }
        (Path(tmp) / "work.json").write_text(json.dumps(work))
        (Path(tmp) / "options.json").write_text(json.dumps(o.to_json()))
        (Path(tmp) / "spm.model").write_bytes(codec.vocab.blob)
        runs, left_out = exported(o, engines, Path(tmp), codec.languages.codes)
        for r in range(o.rounds):  # every other round in reverse: noise falls on all
            for model, name in runs if r % 2 == 0 else runs[::-1]:
                command = [sys.executable, "-m", "mtx.bench.decode", tmp, name, str(model)]
                subprocess.run(command, check=True)
                report = json.loads((Path(tmp) / f"{model}-{name}.json").read_text())
                dtypes[model, name] = report["dtype"]
                for beam, run in report["beams"].items():
                    seconds.setdefault((model, name, int(beam)), []).append(run["seconds"])
                    outputs.setdefault((model, name, int(beam)), run["outputs"])
                    if "drafts" in run:
                        drafts[model, name, int(beam)] = run["drafts"]
    return Raced(seconds, outputs, dtypes, drafts, left_out)


def score(tr: Translator, order: list[int], refs, timing: Timing, outputs, reference) -> dict:
    """Speeds (the fastest round), BLEU (with references) and the share of lines equal to
    `reference` (mtx's outputs)."""
    seconds = timing.best
    tokens = sum(len(o) for o in outputs)
    bleu = None
    if refs is not None:
        hyps = [""] * len(order)
        for i, ids in zip(order, outputs):
            hyps[i] = tr.parts.codec.detokenize(ids)
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    same = None
    if reference is not None and reference is not outputs:
        same = sum(a == b for a, b in zip(outputs, reference)) / len(order)
    return {
        "lines": len(order),
        "seconds": seconds,
        "spread": timing.spread,
        "sentences_per_s": len(order) / seconds,
        "tokens_per_s": tokens / seconds,
        "bleu": bleu,
        "same_as_mtx": same,
    }


def label(o: Options, model: int) -> str:
    """A checkpoint's name in the table: its run directory's (RUN/checkpoints/best.pt)."""
    path = o.checkpoints[model]
    name = path.parent.parent.name if path.parent.name == "checkpoints" else path.stem
    return name if len(o.checkpoints) == 1 else f"{model + 1}:{name}"


def results(o: Options, engines, tr, lines, plan) -> tuple[list[dict], list[str]]:
    order = [i for _, idx in plan for i in idx]
    ref = o.ref or o.src.with_suffix("." + tr.parts.config.data.tgt_lang)
    refs = list(read_lines(ref))[: len(lines)] if ref.exists() else None
    raced = race(o, engines, tr, lines, plan)
    rows = []
    for beam in o.beams:
        for model, name in raced.dtypes:
            if (model, name, beam) not in raced.seconds:  # a -draft engine beyond beam 1
                continue
            batch = f"{o.batch_tokens} tokens" if o.batch_tokens else o.batch
            row = {"model": label(o, model), "engine": name, "beam": beam, "batch": batch}
            row["dtype"] = raced.dtypes[model, name]
            mtx_out = raced.outputs.get((model, "mtx", beam))
            timing = Timing(raced.seconds[model, name, beam])
            outputs = raced.outputs[model, name, beam]
            rows.append(row | score(tr, order, refs, timing, outputs, mtx_out))
            if (model, name, beam) in raced.drafts:
                rows[-1]["drafts"] = raced.drafts[model, name, beam]
    by = {(r["model"], r["engine"], r["beam"]): r for r in rows}
    first = label(o, 0)
    for r in rows:
        for peer in PEERS.get(r["engine"], ()):
            if (r["model"], peer, r["beam"]) in by:
                other = by[r["model"], peer, r["beam"]]
                r[f"speedup_vs_{peer}"] = r["tokens_per_s"] / other["tokens_per_s"]
        if r["model"] != first and (first, r["engine"], r["beam"]) in by:
            other = by[first, r["engine"], r["beam"]]
            r["speedup_vs_first"] = r["sentences_per_s"] / other["sentences_per_s"]
    return rows, raced.left_out


def table(rows: list[dict], left_out: list[str], o: Options, machine: dict) -> str:
    several = len(o.checkpoints) > 1
    out = [
        f"{rows[0]['lines']} lines, batches of {rows[0]['batch']}, device {o.device}, "
        f"{o.dtype}, threads {o.threads}; {describe_machine(machine)}",
        "| model | engine | beam | seconds | sentences/s | tokens/s | BLEU | same as mtx |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        same = "-" if r["same_as_mtx"] is None else f"{100 * r['same_as_mtx']:.1f}%"
        bleu = "-" if r["bleu"] is None else f"{r['bleu']:.2f}"
        out.append(
            f"| {r['model']} | {r['engine']} | {r['beam']} | {r['seconds']:.2f} "
            f"| {r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f} | {bleu} | {same} |"
        )
    for r in rows:
        who = f"{r['model']} " if several else ""
        for peer in PEERS.get(r["engine"], ()):
            if f"speedup_vs_{peer}" in r:
                ratio = r[f"speedup_vs_{peer}"]
                out.append(f"{who}{r['engine']} / {peer} tokens/s, beam {r['beam']}: {ratio:.2f}x")
        if "drafts" in r:
            said = DraftStats.from_json(r["drafts"]).summary().removeprefix("drafts: ")
            out.append(f"{who}{r['engine']} drafts, beam {r['beam']}: {said}")
        if "speedup_vs_first" in r:
            out.append(
                f"{r['model']} / {label(o, 0)} sentences/s, {r['engine']}, beam {r['beam']}: "
                f"{r['speedup_vs_first']:.2f}x"
            )
    return "\n".join(out + [f"left out: {reason}" for reason in left_out])


def run(o: Options) -> str:
    """`mtx bench decode`'s output: the table, or the harness's JSON result (one line)."""
    engines = o.engines.split(",")
    unknown = [e for e in engines if e not in (*ENGINES, *SEARCHES)]
    if unknown:
        raise MtxError(
            f"--engines: {unknown[0]!r} is not one of {', '.join({**dict.fromkeys(ENGINES), **SEARCHES})}"
        )
    if o.dtype not in DTYPES:
        raise MtxError(f"--dtype must be one of {', '.join(DTYPES)}, got {o.dtype!r}")
    if o.device != "cpu" or o.dtype != "fp32":  # int8 weights: the CPU, fp32 only
        engines = [e for e in engines if not e.startswith("mtx-int8")]
    if o.shortlist is None and any(e.endswith("-shortlist") for e in engines):
        raise MtxError("--engines mtx-shortlist and mtx-int8-shortlist need --shortlist FILE")
    if o.draft is None and any(e.endswith("-draft") for e in engines):
        raise MtxError(
            "--engines mtx-draft, mtx-int8-draft and mtx-adaptive-draft need --draft CHECKPOINT"
        )
    lines = list(read_lines(o.src))
    lines = lines[: o.lines] if o.lines else lines
    overrides = ["decode.alpha=0", f"decode.dtype={o.dtype}"]
    tr = Translator.from_checkpoints(o.checkpoints[0], overrides, device="cpu")
    for path in o.checkpoints[1:]:
        theirs = Translator.from_checkpoints(path, device="cpu").parts.codec.vocab.blob
        if theirs != tr.parts.codec.vocab.blob:
            raise MtxError(f"{path}: another vocabulary than {o.checkpoints[0]}'s")
    plan, skipped = batches(tr, lines, o.batch), []
    if o.batch_tokens:  # every line in one call of translate, which batches them
        plan = [(0, list(range(len(lines))))]
        skipped = [f"{e}: --batch-tokens races mtx's own batching only" for e in engines
                   if e not in SEARCHES]  # fmt: skip
        engines = [e for e in engines if e in SEARCHES]
    rows, left_out = results(o, engines, tr, lines, plan)
    left_out = skipped + left_out
    report = result("decode", {"results": rows, "left_out": left_out}, **o.to_json())
    return json.dumps(report) if o.json else table(rows, left_out, o, report["machine"])


if __name__ == "__main__":  # one engine's process (race): WORK_DIR NAME MODEL
    worker(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
