"""`mtx bench train|decode|score|corpus|serve|prepare|clean`: the benchmarks of mtx/bench/, each a
Typer command whose flags make that benchmark's `Options`. `mtx bench --config C ...` is
`mtx bench train --config C ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mtx.cli.app import ConfigOpt, JsonOpt, SetOpt, fail, load, run

bench_app = typer.Typer(
    help="The benchmarks of mtx/bench/: train, decode, score, corpus, serve, prepare, clean. "
    "`mtx bench --config C ...` is `mtx bench train --config C ...`.",
    invoke_without_command=True,
)


def numbers(text: str, flag: str) -> list[int]:
    """A comma-separated list of positive numbers ("1,4,16"), or a one-line error."""
    items = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() and int(x) > 0 for x in items):
        fail(f"{flag} expects positive numbers separated by commas, got {text!r}")
    return [int(x) for x in items]


StepsOpt = Annotated[int, typer.Option(min=1, help="Updates timed.")]
WarmupOpt = Annotated[
    int, typer.Option(min=0, help="Updates run before timing, cycling through the timed ones.")
]
RepeatsOpt = Annotated[
    int, typer.Option(min=1, help="Timed passes over the updates; the median counts.")
]
SyntheticOpt = Annotated[
    bool, typer.Option(help="Random token batches instead of RUN/prepared's training data.")
]
LengthOpt = Annotated[int, typer.Option(min=2, help="Mean sentence length of --synthetic batches.")]
PeakOpt = Annotated[
    float | None, typer.Option(help="Device peak for MFU (default: known bf16/fp16 GPU peaks).")
]
LengthsFromOpt = Annotated[
    Path | None,
    typer.Option(
        help="Random token batches with the sentence lengths of this prepared split "
        "(e.g. RUN/prepared/train), in data.vocab_size."
    ),
]
JoinOpt = Annotated[
    str, typer.Option(help="With --lengths-from: join N-M random pairs into one (e.g. 2-4).")
]


def bench_train(
    ctx: typer.Context,
    config: ConfigOpt = None,
    set: SetOpt = None,
    steps: StepsOpt = 20,
    warmup: WarmupOpt = 5,
    repeats: RepeatsOpt = 1,
    synthetic: SyntheticOpt = False,
    length: LengthOpt = 30,
    peak_tflops: PeakOpt = None,
    lengths_from: LengthsFromOpt = None,
    join: JoinOpt = "1-1",
    json_out: JsonOpt = False,
) -> None:
    """Training tokens/s, model FLOPs per token, TFLOP/s, MFU and peak memory of a config."""
    if ctx.invoked_subcommand is not None:
        return  # `mtx bench decode ...`: the subcommand runs
    from mtx.bench.train import Options
    from mtx.bench.train import run as run_bench

    low, _, high = join.partition("-")
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
        fail(f"--join expects N-M with 1 <= N <= M, got {join!r}")
    cfg = load(config, set)
    where = str(lengths_from) if lengths_from else None
    joined = (int(low), int(high))
    options = Options(steps, warmup, repeats, synthetic, length, peak_tflops, where, joined)
    typer.echo(run(run_bench, cfg, options, json_out))


bench_app.callback()(bench_train)
bench_app.command("train")(bench_train)

CheckpointOpt = Annotated[Path, typer.Option(help="The checkpoint to decode with.")]
JsonFileOpt = Annotated[
    Path | None, typer.Option("--json", help="Also write the JSON result here.")
]
SrcOpt = Annotated[Path, typer.Option(help="Source sentences, one per line.")]
LinesOpt = Annotated[int, typer.Option(min=0, help="Only the first N lines (0: all).")]
BatchTokensOpt = Annotated[
    int,
    typer.Option(
        min=0,
        help="Race the mtx engines alone, each in `mtx translate`'s own batches of this many "
        "padded source tokens (decode.batch_tokens; 4096 by default) instead.",
    ),
]


EnginesOpt = Annotated[
    str,
    typer.Option(
        help="Comma-separated: mtx, mtx-int8, hf, ct2, ct2-int8 (the default), mtx-static, "
        "mtx-graphs, mtx-shortlist, mtx-int8-shortlist, mtx-draft, mtx-int8-draft, "
        "mtx-adaptive-draft."
    ),
]
ShortlistOpt = Annotated[
    Path | None,
    typer.Option(help="The lexical shortlist (`mtx shortlist`) of the *-shortlist engines."),
]
DraftOpt = Annotated[
    Path | None, typer.Option(help="The draft model (decode.draft) of the *-draft engines.")
]


@bench_app.command("decode")
def bench_decode(
    checkpoint: Annotated[
        list[Path],
        typer.Option(
            help="The checkpoint to decode with; repeat it to race several (a student and its "
            "teacher) on the same batches."
        ),
    ],
    src: SrcOpt,
    ref: Annotated[
        Path | None, typer.Option(help="Reference translations, for BLEU (default: beside --src).")
    ] = None,
    lines: LinesOpt = 0,
    batch: Annotated[int, typer.Option(min=1, help="Sentences per batch.")] = 32,
    batch_tokens: BatchTokensOpt = 0,
    beam: Annotated[
        list[int] | None, typer.Option(min=1, help="A beam size (repeatable; default 4 and 1).")
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="CPU threads of every engine.")] = 2,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Every engine's: fp32, bf16 or fp16.")] = "fp32",
    engines: EnginesOpt = "mtx,mtx-int8,hf,ct2,ct2-int8",
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs per engine: the fastest.")] = 2,
    stopping: Annotated[str, typer.Option(help="mtx's decode.stopping.")] = "k_finished",
    shortlist: ShortlistOpt = None,
    draft: DraftOpt = None,
    draft_tokens: Annotated[int, typer.Option(min=1, help="Their decode.draft_tokens.")] = 4,
    json_out: JsonOpt = False,
) -> None:
    """Decoding speed of mtx against Hugging Face MarianMT and CTranslate2 on the same weights."""
    from mtx.bench import decode

    options = decode.Options(
        checkpoint, src, ref, lines, batch, batch_tokens, beam or [4, 1], threads, device,
        dtype, engines, rounds, stopping, json_out, shortlist, draft, draft_tokens,
    )  # fmt: skip
    typer.echo(run(decode.run, options))


@bench_app.command("score")
def bench_score(
    checkpoint: CheckpointOpt,
    src: SrcOpt,
    tgt: Annotated[Path | None, typer.Option(help="Their targets (default: beside --src).")] = None,
    lines: LinesOpt = 0,
    beam: Annotated[
        list[int] | None, typer.Option(min=1, help="A beam size (repeatable; default 4 and 1).")
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="CPU threads.")] = 2,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs of each: the median.")] = 3,
    json_out: JsonOpt = False,
) -> None:
    """`mtx score` against translating the same lines, and real pairs against shuffled ones."""
    from mtx.bench import score

    options = score.Options(
        checkpoint, src, tgt, lines, beam or [4, 1], threads, device, rounds, json_out
    )
    typer.echo(run(score.run, options))


@bench_app.command("corpus")
def bench_corpus(
    checkpoint: CheckpointOpt,
    src: SrcOpt,
    tgt: Annotated[
        Path | None,
        typer.Option(help="Score's targets, distill's references (default: beside --src)."),
    ] = None,
    lines: Annotated[int, typer.Option(min=0, help="The first N lines of --src (0: all).")] = 3000,
    jobs: Annotated[str, typer.Option(help="Comma-separated: translate, score, distill.")] = (
        "translate,score,distill"
    ),
    processes: Annotated[str, typer.Option(help="Process counts, comma-separated.")] = "1,2",
    beam: Annotated[int, typer.Option(min=1, help="translate's and distill's beam.")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs of each: the median.")] = 2,
    kill: Annotated[
        bool, typer.Option("--kill", help="Also a run whose rank 1 is SIGKILLed and restarted.")
    ] = False,
    work: Annotated[Path, typer.Option(help="Where the inputs and outputs go.")] = Path(
        "/tmp/bench_corpus"
    ),
    json_out: JsonOpt = False,
) -> None:
    """Corpus jobs (translate, score, distill) on N torchrun processes against one: seconds,
    speed, merge time, and whether the outputs are byte-identical."""
    from mtx.bench import corpus

    counts = numbers(processes, "--processes")
    options = corpus.Options(
        checkpoint, src, tgt, lines, jobs.split(","), counts, beam, rounds, kill, work, json_out
    )
    typer.echo(run(corpus.run, options))


@bench_app.command("serve")
def bench_serve(
    checkpoint: CheckpointOpt,
    src: SrcOpt,
    set: SetOpt = None,
    lines: LinesOpt = 0,
    clients: Annotated[str, typer.Option(help="Client counts, comma-separated.")] = "1,4,16,64",
    lines_per_request: Annotated[int, typer.Option(min=1, help="Lines in each request.")] = 1,
    requests: Annotated[int, typer.Option(min=1, help="At most, per client count.")] = 1000,
    seconds: Annotated[float, typer.Option(min=0, help="At most, per client count.")] = 60.0,
    modes: Annotated[
        str,
        typer.Option(
            help="Servers, comma-separated: batched, one-decoder, unbatched, ctranslate2."
        ),
    ] = "batched,one-decoder,unbatched,ctranslate2",
    memory_requests: Annotated[
        int, typer.Option(min=0, help="The batched server's memory after this many more requests.")
    ] = 0,
    json_file: JsonFileOpt = None,
) -> None:
    """Load test of `mtx serve` on 127.0.0.1: throughput and latency against the batch CLI.
    --set is passed to every server."""
    from mtx.bench import serve

    counts = numbers(clients, "--clients")
    options = serve.Options(
        checkpoint, src, lines, counts, lines_per_request, requests, seconds, modes.split(","),
        memory_requests, list(set or []), json_file,
    )  # fmt: skip
    run(serve.run, options)


@bench_app.command("prepare")
def bench_prepare(
    pairs: Annotated[int, typer.Option(min=1, help="Pairs of the corpus built from --data.")] = (
        4_500_000
    ),
    workers: Annotated[
        str,
        typer.Option(help="Comma-separated runs: data.workers W, or W@C on C cores (taskset)."),
    ] = "1@1,1,2",
    work: Annotated[Path, typer.Option(help="The corpus and the run directories.")] = Path(
        "/tmp/bench_prepare"
    ),
    data: Annotated[Path, typer.Option(help="Multi30k's plain-text files.")] = Path(
        "data/multi30k"
    ),
    config: Annotated[Path, typer.Option(help="The config `mtx prepare` runs with.")] = Path(
        "configs/base.yaml"
    ),
    sample_every: Annotated[
        float, typer.Option(min=0.01, help="Seconds between memory samples.")
    ] = 2.0,
    json_file: JsonFileOpt = None,
    set: SetOpt = None,
) -> None:
    """`mtx prepare` of a WMT-size corpus: seconds per stage and peak memory, by worker count."""
    from mtx.bench import prepare

    options = prepare.Options(
        pairs, workers.split(","), work, data, config, sample_every, json_file, set or []
    )
    typer.echo(run(prepare.run, options))


@bench_app.command("clean")
def bench_clean(
    out: Annotated[
        Path, typer.Option(help="Prefix of the noisy corpus written: OUT.de/.en/.kind.")
    ],
    data: Annotated[Path, typer.Option(help="Multi30k's plain-text files.")] = Path(
        "data/multi30k"
    ),
    third: Annotated[
        list[Path] | None,
        typer.Option(help="Third-language captions line-aligned with Multi30k's train (repeat)."),
    ] = None,
    noise: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of noise in the whole.")] = (
        1 / 3
    ),
    seed: Annotated[int, typer.Option(help="Seed of the noise.")] = 1,
    run_dir: Annotated[Path | None, typer.Option(help="Where `mtx prepare` runs.")] = None,
    config: Annotated[Path, typer.Option(help="The config `mtx prepare` runs with.")] = Path(
        "configs/multi30k.yaml"
    ),
    set: SetOpt = None,
    json_file: JsonFileOpt = None,
    langid_lines: Annotated[
        list[str] | None,
        typer.Option(help="LANG=FILE, repeated: race the language identifiers on these lines."),
    ] = None,
) -> None:
    """The cleaning rules on Multi30k with known noise: each rule's precision and recall."""
    from mtx.bench import clean

    files = {}
    for item in langid_lines or []:
        lang, _, path = item.partition("=")
        if not (lang and path and Path(path).is_file()):
            fail(f"--langid-lines expects LANG=FILE with an existing file, got {item!r}")
        files[lang] = Path(path)
    options = clean.Options(
        out, data, third or [], noise, seed, run_dir, config, set or [], json_file, files
    )
    typer.echo(run(clean.run, options))
