"""`mtx translate`, `mtx evaluate` and `mtx serve`: decoding with trained checkpoints."""

from __future__ import annotations

import json
import os
import sys
from collections import deque
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
from mtx.cli.lines import Output, Reader, load_glossary, sha256_of
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


def _translator(
    checkpoint, config, set, beam, alpha, batch_tokens, device, tgt_lang=None, **decode
):
    """A Translator into `tgt_lang`; options given on the command line override the
    checkpoint's decode.*."""
    from mtx.decode.translator import Translator

    options = dict(beam=beam, alpha=alpha, batch_tokens=batch_tokens, **decode)
    # typed values, as the config declares them (a path as its string)
    typed = {k: str(v) if isinstance(v, Path) else v for k, v in options.items() if v is not None}
    paths = checkpoint_paths(checkpoint, config, set)
    translator = run(Translator.from_checkpoints, paths, list(set or []), device, typed)
    return run(translator.into, tgt_lang)


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
    steered = json_lines or glossary is not None
    _check_options(checkpoint, attention_dir, every_head, input, output, resume, steered, document)
    options = dict(dtype=dtype, shortlist=shortlist, stopping=stopping, top_p=top_p, seed=seed,
                   sampling=sample or None, temperature=temperature, top_k=top_k,
                   alignments=alignments or None, format=format, draft=draft)  # fmt: skip
    terms = run(load_glossary, glossary)
    translator = _translator(checkpoint, config, set, beam, alpha, batch_tokens, device, tgt_lang,
                             **options)  # fmt: skip
    out = Output(translator, nbest, json_lines, terms)
    if output is not None:
        given = dict(beam=beam, alpha=alpha, tgt_lang=tgt_lang, **options)
        said = _said(set, given, (json_lines, glossary) if steered else None)
        paths = checkpoint_paths(checkpoint, config, set)
        corpus = (input, output, resume, nbest, chunk_lines)
        return _translate_corpus(out, *corpus, paths, said, (json_lines, terms))
    reader = Reader(json_lines, terms, out.documents) if steered else None
    _translate_lines(out, input, reader, chunk_lines, nbest, attention_dir, every_head, document)


def refuse_stream_under_torchrun(command: str, files: str = "--input and --output") -> None:
    """Under torchrun, a command spreads a corpus over the processes: a file to a file."""
    from mtx.distributed import under_torchrun

    if under_torchrun():
        raise MtxError(
            f"{command} under torchrun spreads a corpus over its processes: give {files} "
            "(or run it without torchrun)"
        )


def _check_documents(documents: bool, attention_dir, document: bool) -> None:
    if documents and attention_dir is not None:
        fail("--attention-dir shows one sentence's attention: not with a --format")
    if document and not documents:
        fail("--document reads the whole input as one text: give a --format other than plain")


def _translate_document(out, input, reader) -> None:
    """The whole of stdin (or --input) as one text, its translation to stdout."""
    raw = sys.stdin.buffer.read() if input is None else run(_read_bytes, input)
    text = raw.decode("utf-8", errors="replace").removesuffix("\n")
    item = next(reader.items([text])) if reader is not None else text
    stream = run(out.stream, [item], 1, None)
    run(write_translations, out, stream, None, False, deque([item]))
    out.say_report()


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise MtxError(f"file not found: {path}")
    return path.read_bytes()


def _translate_lines(
    out, input, reader, chunk_lines, nbest, attention_dir, every_head, document=False
) -> None:
    """stdin (or --input) to stdout as the lines arrive; `reader` reads lines with controls;
    `document`: the whole input is one text."""
    _check_documents(out.documents, attention_dir, document)
    if document:
        return _translate_document(out, input, reader)
    lines = read_lines(sys.stdin.buffer) if input is None else run(_file_lines, input)
    sources: deque = deque()  # lines read but not yet written (bounded by the stream)
    if reader is not None:
        lines = _recorded(reader.items(lines), sources)
    elif attention_dir is not None:
        lines = _recorded(lines, sources)
    # the settings are checked here, before any input is read or any file written
    stream = run(out.stream, lines, chunk_lines, STREAM_IDLE_S)
    if attention_dir is not None:
        from mtx.plot import _pyplot

        run(_pyplot)  # a missing matplotlib fails before any work
        run(attention_dir.mkdir, parents=True, exist_ok=True)
    run(write_translations, out, stream, attention_dir, every_head, sources)
    out.say_report()


def _said(overrides, given: dict, steered: tuple | None) -> list[str]:
    """The settings a corpus translation records (jobs/corpus.py's Record): overrides and
    options given, and with controls whether the input is JSON and the glossary's hash."""
    said = [*(overrides or []), *(f"{k}={v}" for k, v in given.items() if v is not None)]
    if steered:
        said += [f"json={steered[0]}", f"glossary={sha256_of(steered[1])}"]
    return said


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


def _translate_corpus(out, input, output, resume, nbest, chunk_lines, paths, said, steering):
    """--input into --output (jobs/translate.py), resuming it with --resume; a summary on stderr.
    With controls (`steering`: JSON lines?, the glossary), every line is read and checked
    before anything is written."""
    from mtx.jobs.translate import run_job, translation_job

    reader = Reader(*steering, out.documents)
    run(out.check)  # before the output is begun

    run(_file_lines, input)  # a missing input: one line, before anything is written
    record = corpus_record(input, paths, said, nbest, out.translator)
    items = None
    if not reader.plain:
        run(_check_items, out.translator, reader, input)
        items = reader.items
    job = run(translation_job, out, input, record, items)
    done = run(run_job, job, output, resume, chunk_lines)
    if done.main:
        log(f"translated {done.lines:,} lines into {output}{processes(done)}")
        out.say_report()


def corpus_record(input: Path, paths, said: list[str], nbest: int, translator):
    """What a corpus job computes (jobs/corpus.py's Record): its input, checkpoints and
    settings (`said`), less those that change nothing (batches; drafts, as speculative
    decoding is exact), with the kind of device (which may)."""
    from mtx.jobs.corpus import Record

    unrecorded = ("decode.batch_tokens=", "decode.draft", "draft=")  # draft, _tokens, _adaptive
    settings = [x for x in said if not x.startswith(unrecorded)]
    settings.append(f"device={translator.device.type}")
    checkpoints = [str(Path(p).resolve()) for p in paths]
    return Record(str(input.resolve()), input.stat().st_size, checkpoints, settings, nbest)


def processes(done) -> str:
    """How many processes did a corpus job (if more than one), how many lines were done before."""
    said = [f"{done.processes} processes"] if done.processes > 1 else []
    said += [f"{done.before:,} done before"] if done.before else []
    if done.merged is not None:
        said.append(f"merged {done.merged[0] / 1e6:,.1f} MB in {done.merged[1]:.2f} s")
    return f" ({', '.join(said)})" if said else ""


def _check_items(translator, reader: Reader, input: Path) -> None:
    """Every line of `input` read and turned into a request: the first bad one refused."""
    for number, item in enumerate(reader.items(_file_lines(input))):
        translator.request(item, number)


def write_translations(out: Output, stream, attention_dir, every_head, sources):
    """The translations of `stream` to stdout as they come (`out` formats each line), and each
    line's attention into `attention_dir` if given (`sources`: the lines read but not yet
    written, or the `Line`s with controls)."""
    stdout = sys.stdout
    try:
        for number, hyps in enumerate(stream):
            item = sources.popleft() if sources else None
            if attention_dir is not None:
                from mtx.plot import write_attention

                record = out.translator.cross_attention(item, hyps[0].tokens)
                write_attention(attention_dir, number + 1, record, every_head)
            stdout.write(out(number, hyps, item))
            stdout.flush()
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
        translator = _translator(
            checkpoint, config, set, beam, alpha, batch_tokens, device, tgt_lang, dtype=dtype,
            shortlist=shortlist,
        )  # fmt: skip
        if split is not None:
            sets = run(_split_sets, translator.cfg, split)
        elif src is not None and ref is not None:
            sets = [("", None, run(_read_text, src), run(_read_text, ref))]
        else:
            fail("give --hyp and --ref, or a model with --src and --ref, or a model with --split")
        results, all_hyps = {}, []
        for name, lang, sources, refs in sets:
            into = (
                run(translator.into, lang) if lang and translator.langs.needs_target else translator
            )
            hyps = run(into.translate, sources)
            results[name] = run(score, hyps, refs)
            all_hyps += hyps
        if output is not None:
            run(atomic_write_text, output, "".join(h + "\n" for h in all_hyps))
    _print_scores(results, json_out)


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
