"""The `mtx` command line. Each command parses its options, loads the config and calls one function.

Errors in the user's input end the command with one line on stderr and exit code 2; `mtx
--debug COMMAND` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from mtx.config import describe
from mtx.errors import MtxError
from mtx.files import atomic_write_text, restrict_umask

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train Transformer translation models end to end.",
)
_debug = False

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a config key: key=value (repeatable; every key: docs/config.md).",
    ),
]
CkptOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--checkpoint",
        help="A checkpoint (embeds its config and vocabulary). Repeat it to decode with the "
        "ensemble of several: the mean of their probabilities at each step.",
    ),
]


def fail(message: str) -> None:
    typer.echo(f"mtx: error: {message}", err=True)
    raise typer.Exit(2)


def run(fn, *args, **kwargs):
    """Call fn, turning MtxError into a one-line message and exit code 2 (130 on Ctrl-C)."""
    try:
        return fn(*args, **kwargs)
    except MtxError as e:
        if _debug:
            raise
        fail(str(e))
    except OSError as e:  # permissions, a full disk, a file where a directory should be
        if _debug:
            raise
        fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
    except KeyboardInterrupt:
        if _debug:
            raise
        typer.echo("mtx: interrupted", err=True)
        raise typer.Exit(130) from None


def log(msg: str) -> None:
    typer.echo(msg, err=True)


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    global _debug
    _debug = debug
    restrict_umask()


def _config(config: Path | None, overrides: list[str] | None):
    from mtx.config import load_config

    if config is None:
        fail("--config is required")
    return run(load_config, config, overrides)


def _checkpoint_paths(
    checkpoints: list[Path] | None, config: Path | None, overrides: list[str] | None
) -> list[Path]:
    """The checkpoints given, or RUN/checkpoints/best.pt of the config's run."""
    if checkpoints:
        return checkpoints
    if config is None:
        fail("give --checkpoint, or --config to use RUN/checkpoints/best.pt")
    from mtx.checkpoint import RunDir

    return [RunDir.of(_config(config, overrides)).best]


@app.command()
def prepare(config: ConfigOpt = None, set: SetOpt = None) -> None:
    """Load, clean, learn SentencePiece BPE and encode the data into RUN/prepared."""
    from mtx.data.prepare import prepare as do_prepare

    cfg = _config(config, set)
    run(do_prepare, cfg, log=log)


@app.command()
def train(
    config: ConfigOpt = None,
    set: SetOpt = None,
    resume: Annotated[bool, typer.Option(help="Continue from RUN/checkpoints/last.pt.")] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Delete RUN's checkpoints and metrics and start again.")
    ] = False,
    init_from: Annotated[
        str | None,
        typer.Option(
            help="Start from this checkpoint's weights (fine-tuning; train.init_from): fresh "
            "optimizer, step 0. Prepare the data with data.spm_model=CKPT first."
        ),
    ] = None,
    keep_optimizer: Annotated[
        bool, typer.Option(help="With --init-from: keep its Adam state (last.pt, step-N.pt).")
    ] = False,
    keep_step: Annotated[
        bool, typer.Option(help="With --init-from: continue its step and learning rate.")
    ] = False,
) -> None:
    """Train on the prepared data; checkpoints and metrics.jsonl go to RUN."""
    from mtx.train.trainer import train as do_train

    items = list(set or [])
    items += [f"train.init_from={init_from}"] if init_from else []
    items += ["train.init_keep_optimizer=true"] if keep_optimizer else []
    items += ["train.init_keep_step=true"] if keep_step else []
    cfg = _config(config, items)
    run(do_train, cfg, resume=resume, overwrite=overwrite, log=log)


def read_lines(stream) -> Iterator[str]:
    """Lines of a binary stream, split on "\\n" only, decoded as UTF-8 (invalid bytes replaced)."""
    for raw in stream:
        yield raw.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r")


def _translator(
    checkpoint, config, set, beam, alpha, batch_tokens, device, tgt_lang=None, **decode
):
    """A Translator into `tgt_lang`; options given on the command line override the
    checkpoint's decode.*."""
    from mtx.decode.translator import Translator

    overrides = list(set or [])
    options = dict(beam=beam, alpha=alpha, batch_tokens=batch_tokens, **decode)
    overrides += [f"decode.{key}={value}" for key, value in options.items() if value is not None]
    paths = _checkpoint_paths(checkpoint, config, set)
    translator = run(Translator.from_checkpoints, paths, overrides, device)
    return run(translator.into, tgt_lang)


def setting_help(key: str, default: str = "the checkpoint's") -> str:
    """An option's help from the config key it sets (config.py's declaration of it)."""
    text = describe(key).replace("[", "\\[")  # not a rich markup tag
    return f"{text[0].upper()}{text[1:]}; default: {default} {key}."


BeamOpt = Annotated[int | None, typer.Option(help=setting_help("decode.beam"))]
AlphaOpt = Annotated[float | None, typer.Option(help=setting_help("decode.alpha"))]
BatchOpt = Annotated[
    int | None, typer.Option("--batch-tokens", help=setting_help("decode.batch_tokens"))
]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str | None, typer.Option(help=setting_help("decode.dtype"))]
TgtLangOpt = Annotated[
    str | None,
    typer.Option(
        help="The language to translate into: required when the model has several "
        "(`mtx info` lists them)."
    ),
]
STREAM_IDLE_S = 0.05  # a pause this long in the input sends the lines read so far


@app.command()
def serve(
    checkpoint: CkptOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    host: Annotated[
        str | None, typer.Option(help=setting_help("serve.host", "the config's"))
    ] = None,
    port: Annotated[
        int | None, typer.Option(help=setting_help("serve.port", "the config's"))
    ] = None,
    engine: Annotated[
        str, typer.Option(help="mtx (exact, the default) or ctranslate2 (an export; not exact).")
    ] = "mtx",
    ct2_dir: Annotated[
        Path | None,
        typer.Option(help="ctranslate2: the export to use (default CKPT.ct2, made if missing)."),
    ] = None,
    device: DeviceOpt = "auto",
) -> None:
    """Serve translations over HTTP: POST /translate, /health, /ready, /info, /metrics, a page."""
    from mtx.serve.main import serve as do_serve

    overrides = list(set or [])
    overrides += [f"serve.{k}={v}" for k, v in (("host", host), ("port", port)) if v is not None]
    paths = _checkpoint_paths(checkpoint, config, set)
    run(do_serve, paths, overrides, engine, device, ct2_dir, log)


@app.command()
def translate(
    checkpoint: CkptOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    beam: BeamOpt = None,
    alpha: AlphaOpt = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    tgt_lang: TgtLangOpt = None,
    nbest: Annotated[
        int,
        typer.Option(
            help="Print the N best hypotheses (N samples with --sample) of each line as "
            "'LINE ||| TRANSLATION ||| SCORE ||| LOG-PROBABILITY'."
        ),
    ] = 1,
    stopping: Annotated[str | None, typer.Option(help=setting_help("decode.stopping"))] = None,
    sample: Annotated[
        bool, typer.Option("--sample", help="Sample each token instead of searching.")
    ] = False,
    temperature: Annotated[
        float | None, typer.Option(help=setting_help("decode.temperature"))
    ] = None,
    top_k: Annotated[int | None, typer.Option(help=setting_help("decode.top_k"))] = None,
    top_p: Annotated[float | None, typer.Option(help=setting_help("decode.top_p"))] = None,
    seed: Annotated[int | None, typer.Option(help=setting_help("decode.seed"))] = None,
    chunk_lines: Annotated[
        int, typer.Option(help="Most lines translated together from the stream.")
    ] = 512,
    attention_dir: Annotated[
        Path | None,
        typer.Option(
            help="Write each line's encoder-decoder attention here: NNNNNN.png (averaged over "
            "layers and heads) and NNNNNN.json (subwords, weights, alignment)."
        ),
    ] = None,
    every_head: Annotated[
        bool, typer.Option("--every-head", help="With --attention-dir: also each layer and head.")
    ] = False,
) -> None:
    """Translate stdin to stdout, one line per line, in order, as the input arrives."""
    if attention_dir is not None and checkpoint and len(checkpoint) > 1:
        fail("--attention-dir shows one model's attention: give one --checkpoint")
    translator = _translator(
        checkpoint, config, set, beam, alpha, batch_tokens, device, tgt_lang, dtype=dtype,
        stopping=stopping, sampling=True if sample else None, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed,
    )  # fmt: skip
    run(translator.check_nbest, nbest)
    run(translator.check_language)
    if every_head and attention_dir is None:
        fail("--every-head needs --attention-dir")
    if attention_dir is not None:
        from mtx.plot import _pyplot

        run(_pyplot)  # a missing matplotlib fails before any work
        run(attention_dir.mkdir, parents=True, exist_ok=True)

    run(write_translations, translator, chunk_lines, nbest, attention_dir, every_head)


def write_translations(translator, chunk_lines: int, nbest: int, attention_dir, every_head):
    """stdin's lines translated to stdout as they come (with `nbest` > 1, as 'LINE ||| TEXT |||
    SCORE ||| LOG-PROBABILITY'), and each line's attention into `attention_dir` if given."""
    out = sys.stdout
    lines = read_lines(sys.stdin.buffer)
    sources: deque[str] = deque()  # lines read but not yet written (bounded by the stream)
    if attention_dir is not None:
        lines = _recorded(lines, sources)
    stream = translator.hypotheses_stream(lines, chunk_lines, STREAM_IDLE_S, nbest)
    try:
        for number, hyps in enumerate(stream):
            if attention_dir is not None:
                from mtx.plot import write_attention

                record = translator.cross_attention(sources.popleft(), hyps[0].tokens)
                write_attention(attention_dir, number + 1, record, every_head)
            for h in hyps:
                text = translator.detokenize(h.tokens)
                if nbest > 1:
                    text = f"{number} ||| {text} ||| {h.score:.6f} ||| {h.log_prob:.6f}"
                out.write(text + "\n")
            out.flush()
    except BrokenPipeError:  # the reader went away (`mtx translate ... | head`): stop
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _recorded(lines: Iterator[str], seen: deque) -> Iterator[str]:
    for line in lines:
        seen.append(line)
        yield line


def _read_text(path: Path) -> list[str]:
    from mtx.data.sources import read_lines as read_file_lines

    if not path.is_file():
        raise MtxError(f"file not found: {path}")
    return list(read_file_lines(path))


@app.command()
def evaluate(
    checkpoint: CkptOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    src: Annotated[Path | None, typer.Option(help="Source file to translate.")] = None,
    ref: Annotated[Path | None, typer.Option(help="Reference translations.")] = None,
    hyp: Annotated[
        Path | None, typer.Option(help="Translations to score (no model needed).")
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="valid or test split of the run's prepared data.")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the translations here.")] = None,
    beam: BeamOpt = None,
    alpha: AlphaOpt = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    tgt_lang: TgtLangOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Score translations with sacreBLEU (BLEU, chrF), translating first if given a model.
    --split scores each of the split's sets (each direction of a multilingual model)."""
    from mtx.evaluate import score

    if hyp is not None:
        if ref is None:
            fail("--hyp needs --ref")
        results = {"": run(score, run(_read_text, hyp), run(_read_text, ref))}
    else:
        translator = _translator(
            checkpoint, config, set, beam, alpha, batch_tokens, device, tgt_lang, dtype=dtype
        )
        if split is not None:
            sets = run(_split_sets, translator.cfg, split)
        elif src is not None and ref is not None:
            sets = [("", None, run(_read_text, src), run(_read_text, ref))]
        else:
            fail("give --hyp and --ref, or a model with --src and --ref, or a model with --split")
        results, all_hyps = {}, []
        for name, lang, sources, refs in sets:
            into = run(translator.into, lang) if lang and translator.tags else translator
            hyps = run(into.translate, sources)
            results[name] = run(score, hyps, refs)
            all_hyps += hyps
        if output is not None:
            run(atomic_write_text, output, "".join(h + "\n" for h in all_hyps))
    _print_scores(results, json_out)


def _print_scores(results: dict[str, dict], json_out: bool) -> None:
    """One set's scores as sacreBLEU prints them; several, each under its name, and their
    mean (in JSON: {"sets": {NAME: scores}, "bleu": mean, "chrf": mean})."""
    if len(results) > 1:
        mean = {
            k: round(sum(r[k] for r in results.values()) / len(results), 2)
            for k in ("bleu", "chrf")
        }
    if json_out:
        one = next(iter(results.values()))
        typer.echo(json.dumps(one if len(results) == 1 else {"sets": results} | mean))
        return
    for name, result in results.items():
        indent = "  " if len(results) > 1 else ""
        if len(results) > 1:
            typer.echo(f"{name}:")
        typer.echo(indent + result["bleu_detail"])
        typer.echo(f"{indent}chrF2 = {result['chrf']:.2f}")
        typer.echo(f"{indent}signature: {result['signature']}")
    if len(results) > 1:
        typer.echo(
            f"mean over {len(results)} sets: BLEU {mean['bleu']:.2f}, chrF2 {mean['chrf']:.2f}"
        )


def _split_sets(cfg, split: str) -> list[tuple[str, str | None, list[str], list[str]]]:
    """(name, target language, sources, references) of each set of a prepared split."""
    from mtx.data.prepared import load_sets

    if split not in ("train", "valid", "test"):
        raise MtxError(f"--split must be train, valid or test, got {split!r}")
    return [(s.name, s.tgt_lang, s.ds["src"], s.ds["tgt"]) for s in load_sets(cfg, split)]


@app.command()
def info(
    target: Annotated[str, typer.Argument(help="A YAML config or a checkpoint.")],
    set: SetOpt = None,
    length: Annotated[int, typer.Option(help="Tokens per side for the FLOPs figures.")] = 32,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Architecture, parameter count and FLOPs per token."""
    from mtx.info import describe

    about = run(describe, target, set, length)
    typer.echo(json.dumps(about.to_json()) if json_out else "\n".join(about.lines()))


@app.command()
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holding metrics.jsonl).")],
    output: Annotated[
        Path | None, typer.Option(help="The PNG to write (default: RUN_DIR/curves.png).")
    ] = None,
) -> None:
    """Draw a run's training and validation curves (loss, perplexity, BLEU where logged,
    learning rate, tokens/s) into a PNG."""
    from mtx.plot import plot_run

    path, panels = run(plot_run, run_dir, output)
    log(f"wrote {path} ({', '.join(panels)})")


@app.command()
def export(
    checkpoint: Annotated[Path, typer.Argument(help="The checkpoint to export.")],
    output: Annotated[Path, typer.Option(help="Directory to create.")],
    format: Annotated[
        str, typer.Option("--format", help="hf (transformers MarianMT) or ctranslate2.")
    ] = "hf",
    quantization: Annotated[
        str | None, typer.Option(help="ctranslate2 only: int8, int8_float32, float16, ...")
    ] = None,
) -> None:
    """Write a checkpoint as a Hugging Face MarianMT or a CTranslate2 model directory."""
    from mtx.export import export as do_export

    about = run(do_export, checkpoint, format, output, quantization)
    log(f"exported {checkpoint} (step {about['step']}) to {output} as {about['format']}")


@app.command()
def average(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="Checkpoints to average, or with --last one run directory."),
    ],
    output: Annotated[Path, typer.Option(help="The averaged checkpoint to write.")],
    last: Annotated[
        int | None,
        typer.Option(min=1, help="Average the N newest step-N.pt checkpoints of the run."),
    ] = None,
) -> None:
    """Average checkpoints' parameters (the paper averaged the last 5 base / 20 big)."""
    from mtx import checkpoint as ckpt

    if last is not None:
        if len(inputs) != 1 or not inputs[0].is_dir():
            fail("--last N takes one run directory (or its checkpoints directory)")
        paths = run(ckpt.last_step_checkpoints, inputs[0], last)
    else:
        paths = inputs
    if any(output.resolve() == p.resolve() for p in paths):
        fail(f"--output {output} is one of the checkpoints being averaged")
    averaged = run(ckpt.average, paths)
    run(averaged.save, output)
    steps = ", ".join(str(s.step) for s in averaged.averaged_from)
    log(f"averaged {len(paths)} checkpoints (steps {steps}) into {output}")


bench_app = typer.Typer(
    help="Benchmarks of the suite (benchmarks/): train, decode, serve, prepare. "
    "`mtx bench --config C ...` is `mtx bench train --config C ...`.",
    invoke_without_command=True,
)
app.add_typer(bench_app, name="bench")


def bench_train(
    ctx: typer.Context,
    config: ConfigOpt = None,
    set: SetOpt = None,
    steps: Annotated[int, typer.Option(min=1, help="Updates timed.")] = 20,
    warmup: Annotated[
        int, typer.Option(min=0, help="Updates run before timing, cycling through the timed ones.")
    ] = 5,
    repeats: Annotated[
        int, typer.Option(min=1, help="Timed passes over the updates; the median counts.")
    ] = 1,
    synthetic: Annotated[
        bool, typer.Option(help="Random token batches instead of RUN/prepared's training data.")
    ] = False,
    length: Annotated[
        int, typer.Option(min=2, help="Mean sentence length of --synthetic batches.")
    ] = 30,
    peak_tflops: Annotated[
        float | None,
        typer.Option(help="Device peak for MFU (default: known bf16/fp16 GPU peaks)."),
    ] = None,
    lengths_from: Annotated[
        Path | None,
        typer.Option(
            help="Random token batches with the sentence lengths of this prepared split "
            "(e.g. RUN/prepared/train), in data.vocab_size."
        ),
    ] = None,
    join: Annotated[
        str,
        typer.Option(help="With --lengths-from: join N-M random pairs into one (e.g. 2-4)."),
    ] = "1-1",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Training tokens/s, model FLOPs per token, TFLOP/s, MFU and peak memory of a config."""
    if ctx.invoked_subcommand is not None:
        return  # `mtx bench decode ...`: the subcommand runs
    from benchmarks.train import Options
    from benchmarks.train import run as run_bench

    low, _, high = join.partition("-")
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
        fail(f"--join expects N-M with 1 <= N <= M, got {join!r}")
    cfg = _config(config, set)
    where = str(lengths_from) if lengths_from else None
    options = Options(steps, warmup, repeats, synthetic, length, peak_tflops, where,
                      (int(low), int(high)))  # fmt: skip
    typer.echo(run(run_bench, cfg, options, json_out))


bench_app.callback()(bench_train)
bench_app.command("train")(bench_train)
# The other benchmarks take their own arguments (`mtx bench decode --help` lists them).
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@bench_app.command("decode", context_settings=PASS_THROUGH, add_help_option=False)
def bench_decode(ctx: typer.Context) -> None:
    """Decoding speed of mtx against Hugging Face MarianMT and CTranslate2 on the same weights."""
    from benchmarks import decode

    run(decode.main, ctx.args)


@bench_app.command("serve", context_settings=PASS_THROUGH, add_help_option=False)
def bench_serve(ctx: typer.Context) -> None:
    """Load test of `mtx serve` on 127.0.0.1: throughput and latency against the batch CLI."""
    from benchmarks import serve

    run(serve.main, ctx.args)


@bench_app.command("prepare", context_settings=PASS_THROUGH, add_help_option=False)
def bench_prepare(ctx: typer.Context) -> None:
    """`mtx prepare` of a WMT-size corpus: seconds per stage and peak memory, by worker count."""
    from benchmarks import prepare

    run(prepare.main, ctx.args)


@app.command()
def toy(
    output: Annotated[Path, typer.Option(help="Prefix P: writes P.en and P.de.")],
    split: Annotated[str, typer.Option(help="train, valid or test.")] = "test",
) -> None:
    """Write a split of the embedded synthetic corpus to plain-text files."""
    from mtx.data import toy as toy_corpus

    if split not in toy_corpus.SPLITS:
        fail(f"--split must be one of {', '.join(toy_corpus.SPLITS)}, got {split!r}")
    run(toy_corpus.write_split, split, output)
    log(f"wrote {output}.en and {output}.de ({toy_corpus.SPLIT_SIZES[split]} pairs)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
