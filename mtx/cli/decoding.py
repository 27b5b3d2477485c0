"""`mtx translate`, `mtx evaluate` and `mtx serve`: decoding with trained checkpoints."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mtx.cli.app import (
    CkptOpt,
    ConfigOpt,
    JsonOpt,
    SetOpt,
    checkpoint_paths,
    fail,
    log,
    run,
    setting_help,
)
from mtx.cli.lines import Output, load_glossary, read_items, sha256_of
from mtx.errors import MtxError
from mtx.files import atomic_write_text

if TYPE_CHECKING:
    from mtx.evaluate import Scores

BeamOpt = Annotated[int | None, typer.Option(help=setting_help("decode.beam"))]
AlphaOpt = Annotated[float | None, typer.Option(help=setting_help("decode.alpha"))]
BatchOpt = Annotated[
    int | None, typer.Option("--batch-tokens", help=setting_help("decode.batch_tokens"))
]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str | None, typer.Option(help=setting_help("decode.dtype"))]
ShortlistOpt = Annotated[Path | None, typer.Option(help=setting_help("decode.shortlist"))]
DraftOpt = Annotated[Path | None, typer.Option(help=setting_help("decode.draft"))]
TgtLangOpt = Annotated[
    str | None,
    typer.Option(
        help="The language to translate into: required when the model has several "
        "(`mtx info` lists them)."
    ),
]
NbestOpt = Annotated[
    int,
    typer.Option(
        help="Print the N best hypotheses (N samples with --sample) of each line as "
        "'LINE ||| TRANSLATION ||| SCORE ||| LOG-PROBABILITY'."
    ),
]
StoppingOpt = Annotated[str | None, typer.Option(help=setting_help("decode.stopping"))]
SampleOpt = Annotated[
    bool, typer.Option("--sample", help="Sample each token instead of searching.")
]
TemperatureOpt = Annotated[float | None, typer.Option(help=setting_help("decode.temperature"))]
TopKOpt = Annotated[int | None, typer.Option(help=setting_help("decode.top_k"))]
TopPOpt = Annotated[float | None, typer.Option(help=setting_help("decode.top_p"))]
SeedOpt = Annotated[int | None, typer.Option(help=setting_help("decode.seed"))]
AlignmentsOpt = Annotated[
    bool,
    typer.Option(
        "--alignments",
        help="Also each output's word alignment: 'TEXT ||| 0-0 1-2' (Pharaoh: source-output "
        "word indices from 0), an `alignments` field with --json (decode.alignments).",
    ),
]
ChunkOpt = Annotated[int, typer.Option(help="Most lines translated together from the stream.")]
AttentionDirOpt = Annotated[
    Path | None,
    typer.Option(
        help="Write each line's encoder-decoder attention here: NNNNNN.png (averaged over "
        "layers and heads) and NNNNNN.json (subwords, weights, alignment)."
    ),
]
EveryHeadOpt = Annotated[
    bool, typer.Option("--every-head", help="With --attention-dir: also each layer and head.")
]
InputOpt = Annotated[
    Path | None, typer.Option(help="Translate this file's lines instead of stdin's.")
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        help="With --input: write the translations here, chunk by chunk, with a progress bar; "
        "a killed run continues with --resume."
    ),
]
ResumeOpt = Annotated[
    bool,
    typer.Option("--resume", help="Continue the --output a killed run began (the same output)."),
]
JsonLinesOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help='Read one JSON object a line ({"text", "prefix", "constraints", "avoid", '
        '"alternatives"}) and write one a line ({"translation", "score", "log_prob", "unmet"}; '
        'with --nbest, "nbest"; with alternatives, "alternatives"). docs/decoding.md, '
        '"Steering a translation".',
    ),
]
GlossaryOpt = Annotated[
    Path | None,
    typer.Option(
        help="SOURCE TERM<TAB>TARGET TERM lines: the target term of each source term a line "
        "contains (words, any case) becomes its constraint."
    ),
]
FormatOpt = Annotated[str | None, typer.Option("--format", help=setting_help("decode.format"))]
DocumentOpt = Annotated[
    bool,
    typer.Option(
        "--document",
        help="Read the whole input as one text (an HTML page, an XML file) instead of one a "
        "line; with a --format other than plain.",
    ),
]
STREAM_IDLE_S = 0.05  # a pause this long in the input sends the lines read so far


def read_lines(stream) -> Iterator[str]:
    """Lines of a binary stream, split on "\\n" only, decoded as UTF-8 (invalid bytes replaced)."""
    for raw in stream:
        yield raw.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r")


def _translator(checkpoint, config, set, device, glossary=None, **settings):
    """A Translator of the checkpoints (an ensemble of several): the decode.* `settings` the
    command line gives (a shortlist, a draft, the dtype, the batch budget) over the
    checkpoint's; a CTranslate2 export made where decode.engine ctranslate2 asks for one."""
    from mtx.decode.translator import Translator

    # typed values, as the config declares them (a path as its string)
    typed = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items() if v is not None}
    paths = checkpoint_paths(checkpoint, config, set)
    translator = run(Translator.from_checkpoints, paths, list(set or []), device, typed, glossary)
    decode = translator.parts.config.decode
    if decode.engine == "ctranslate2" and len(paths) == 1:
        from mtx.decode.ct2 import export_dir
        from mtx.formats import ct2_export_of

        run(ct2_export_of, paths[0], export_dir(paths[0], decode.ct2_dir), not decode.ct2_dir)
    return translator


def _options(translator, **given):
    """The request's options (decode/options.py): the command line's where given, else the
    translator's settings; checked before any input is read."""
    return run(translator.options, **{k: v for k, v in given.items() if v is not None})


def _given(values: dict) -> dict:
    """A command's options that are a request's options (decode/options.py: the same names),
    those given: not None, and a flag only when set (else the settings decide). --draft names
    the draft model (decode.draft), not whether a request asks for it."""
    from mtx.decode.options import names

    asked = set(names()) - {"draft"}
    return {k: v for k, v in values.items() if k in asked and v is not None and v is not False}


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
    paths = checkpoint_paths(checkpoint, config, set)
    run(do_serve, paths, overrides, engine, device, ct2_dir, log)


def translate(
    checkpoint: CkptOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    beam: BeamOpt = None,
    alpha: AlphaOpt = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    shortlist: ShortlistOpt = None,
    draft: DraftOpt = None,
    tgt_lang: TgtLangOpt = None,
    nbest: NbestOpt = 1,
    stopping: StoppingOpt = None,
    sample: SampleOpt = False,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    seed: SeedOpt = None,
    chunk_lines: ChunkOpt = 512,
    attention_dir: AttentionDirOpt = None,
    every_head: EveryHeadOpt = False,
    input: InputOpt = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    json_lines: JsonLinesOpt = False,
    glossary: GlossaryOpt = None,
    alignments: AlignmentsOpt = False,
    format: FormatOpt = None,
    document: DocumentOpt = False,
) -> None:
    """Translate stdin to stdout, line by line, as it arrives; a corpus with --input, --output."""
    given = _given(locals())  # the request's options given (decode/options.py's names)
    steered = json_lines or glossary is not None
    _check_options(checkpoint, attention_dir, every_head, input, output, resume, steered, document)
    terms = run(load_glossary, glossary)
    translator = _translator(checkpoint, config, set, device, terms, batch_tokens=batch_tokens,
                             dtype=dtype, shortlist=shortlist, draft=draft)  # fmt: skip
    # a draft given is a draft asked for; --attention-dir asks for each line's attention
    asked = dict(sampling=sample, attention=attention_dir is not None,
                 draft=translator.parts.setup.draft)  # fmt: skip
    options = _options(translator, **(given | {k: v for k, v in asked.items() if v}))
    out = Output(translator, options, json_lines)
    if output is not None:
        reads = {"json": json_lines, "glossary": sha256_of(glossary)} if steered else {}
        corpus = (input, output, resume, chunk_lines, list(set or []), reads)
        return _translate_corpus(out, *corpus, json_lines)
    _translate_lines(out, input, json_lines, chunk_lines, attention_dir, every_head, document)


def refuse_stream_under_torchrun(command: str, files: str = "--input and --output") -> None:
    """Under torchrun, a command spreads a corpus over the processes: a file to a file."""
    from mtx.distributed import under_torchrun

    if under_torchrun():
        raise MtxError(
            f"{command} under torchrun spreads a corpus over its processes: give {files} "
            "(or run it without torchrun)"
        )


def _check_documents(options, attention_dir, document: bool) -> None:
    if document and not options.documents:
        fail("--document reads the whole input as one text: give a --format other than plain")


def _translate_document(out, input, json_lines: bool) -> None:
    """The whole of stdin (or --input) as one text, its translation to stdout."""
    raw = sys.stdin.buffer.read() if input is None else run(_read_bytes, input)
    text = raw.decode("utf-8", errors="replace").removesuffix("\n")
    items = run(list, read_items([text], json_lines))
    stream = run(out.translator.stream, items, out.options, 1, None)
    run(write_translations, out, stream, None, False)
    out.say_report()


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise MtxError(f"file not found: {path}")
    return path.read_bytes()


def _translate_lines(
    out, input, json_lines: bool, chunk_lines, attention_dir, every_head, document=False
) -> None:
    """stdin (or --input) to stdout as the lines arrive (with `json_lines`, lines with
    controls); `document`: the whole input is one text."""
    _check_documents(out.options, attention_dir, document)
    if document:
        return _translate_document(out, input, json_lines)
    lines = read_lines(sys.stdin.buffer) if input is None else run(_file_lines, input)
    # the options were checked before any input is read or any file written
    stream = run(out.translator.stream, read_items(lines, json_lines), out.options,
                 chunk_lines, STREAM_IDLE_S)  # fmt: skip
    if attention_dir is not None:
        from mtx.plot import _pyplot

        run(_pyplot)  # a missing matplotlib fails before any work
        run(attention_dir.mkdir, parents=True, exist_ok=True)
    run(write_translations, out, stream, attention_dir, every_head)
    out.say_report()


def _check_options(checkpoint, attention_dir, every_head, input, output, resume, steered, document):
    """Refuse, in one line, `mtx translate` options that do not go together."""
    if output is None:
        run(refuse_stream_under_torchrun, "mtx translate")
    if document and output is not None:
        fail("--document translates one text to stdout: no --output")
    if attention_dir is not None and steered:
        fail("--attention-dir takes plain lines: no --json or --glossary")
    if attention_dir is not None and checkpoint and len(checkpoint) > 1:
        fail("--attention-dir shows one model's attention: give one --checkpoint")
    if every_head and attention_dir is None:
        fail("--every-head needs --attention-dir")
    if (output is not None or resume) and (input is None or attention_dir is not None):
        fail("--output and --resume take --input (a file: read again to resume), no attention")


def _file_lines(path: Path) -> Iterator[str]:
    from mtx.data.sources import read_lines as read_file_lines

    if not path.is_file():
        raise MtxError(f"file not found: {path}")
    return read_file_lines(path)


def _translate_corpus(out, input, output, resume, chunk_lines, overrides, reads, json_lines):
    """--input into --output (jobs/translate.py), resuming it with --resume; a summary on
    stderr. With --json, every line is read and checked before anything is written."""
    from mtx.jobs.corpus import Record
    from mtx.jobs.translate import run_job, translation_job

    run(_file_lines, input)  # a missing input: one line, before anything is written
    record = run(Record.of, input, out.translator.parts, out.options, overrides, reads)
    if json_lines or reads:
        run(_check_items, out, input, json_lines)

    def items(lines, first):
        return read_items(lines, json_lines, first)

    job = run(translation_job, out, input, record, items)
    done = run(run_job, job, output, resume, chunk_lines)
    if done.main:
        log(f"translated {done.lines:,} lines into {output}{processes(done)}")
        out.say_report()


def processes(done) -> str:
    """How many processes did a corpus job (if more than one), how many lines were done before."""
    said = [f"{done.processes} processes"] if done.processes > 1 else []
    said += [f"{done.before:,} done before"] if done.before else []
    if done.merged is not None:
        said.append(f"merged {done.merged[0] / 1e6:,.1f} MB in {done.merged[1]:.2f} s")
    return f" ({', '.join(said)})" if said else ""


def _check_items(out, input: Path, json_lines: bool) -> None:
    """Every line of `input` read and turned into its requests, a chunk at a time: the first
    bad one refused."""
    from mtx.decode.stream import chunks

    first = 0
    for chunk in chunks(read_items(_file_lines(input), json_lines), 4096):
        out.translator.requests(chunk, out.options, first)
        first += len(chunk)


def write_translations(out: Output, stream, attention_dir, every_head):
    """The translations of `stream` to stdout as they come (`out` formats each line), and each
    line's attention into `attention_dir` if given."""
    stdout = sys.stdout
    try:
        for number, translation in enumerate(stream):
            if attention_dir is not None and translation.attention is not None:
                from mtx.plot import write_attention

                write_attention(attention_dir, number + 1, translation.attention, every_head)
            stdout.write(out(number, translation))
            stdout.flush()
    except BrokenPipeError:  # the reader went away (`mtx translate ... | head`): stop
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _read_text(path: Path) -> list[str]:
    from mtx.data.sources import read_lines as read_file_lines

    if not path.is_file():
        raise MtxError(f"file not found: {path}")
    return list(read_file_lines(path))


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
    shortlist: ShortlistOpt = None,
    tgt_lang: TgtLangOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Score translations with sacreBLEU (BLEU, chrF), translating first if given a model.
    --split scores each of the split's sets (each direction of a multilingual model)."""
    from mtx.evaluate import score

    if hyp is not None:
        if ref is None:
            fail("--hyp needs --ref")
        results = {"": run(score, run(_read_text, hyp), run(_read_text, ref))}
    else:
        translator = _translator(checkpoint, config, set, device, batch_tokens=batch_tokens,
                                 dtype=dtype, shortlist=shortlist)  # fmt: skip
        if split is not None:
            sets = run(_split_sets, translator.parts.config, split)
        elif src is not None and ref is not None:
            sets = [("", None, run(_read_text, src), run(_read_text, ref))]
        else:
            fail("give --hyp and --ref, or a model with --src and --ref, or a model with --split")
        results = _evaluate_sets(translator, sets, output, beam=beam, alpha=alpha,
                                 tgt_lang=tgt_lang)  # fmt: skip
    _print_scores(results, json_out)


def _evaluate_sets(translator, sets, output: Path | None, **given) -> dict[str, Scores]:
    """Each set translated into its own target language (`given`: the command's options)
    and scored; every translation written into `output` if given."""
    from mtx.evaluate import score

    results, all_hyps = {}, []
    needs_target = translator.parts.codec.languages.needs_target
    for name, lang, sources, refs in sets:
        into = {"tgt_lang": lang} if lang and needs_target else {}
        options = _options(translator, **(given | into))
        hyps = [t.best.text for t in run(translator.translate, sources, options)]
        results[name] = run(score, hyps, refs)
        all_hyps += hyps
    if output is not None:
        run(atomic_write_text, output, "".join(h + "\n" for h in all_hyps))
    return results


def _print_scores(results: dict[str, Scores], json_out: bool) -> None:
    """One set's scores as sacreBLEU prints them; several, each under its name, and their
    mean (in JSON: {"sets": {NAME: scores}, "bleu": mean, "chrf": mean})."""
    n = len(results)
    mean = {
        "bleu": round(sum(r.bleu for r in results.values()) / n, 2),
        "chrf": round(sum(r.chrf for r in results.values()) / n, 2),
    }
    if json_out:
        sets = {name: r.to_json() for name, r in results.items()}
        typer.echo(json.dumps(next(iter(sets.values())) if n == 1 else {"sets": sets} | mean))
        return
    for name, result in results.items():
        indent = "  " if len(results) > 1 else ""
        if len(results) > 1:
            typer.echo(f"{name}:")
        typer.echo(indent + result.bleu_detail)
        typer.echo(f"{indent}chrF2 = {result.chrf:.2f}")
        typer.echo(f"{indent}signature: {result.signature}")
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
