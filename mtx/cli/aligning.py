"""`mtx align`: word alignment outside translation (mtx/align/).

- `mtx align prepared --config C`: eflomal's alignments of the prepared training data, kept
  beside it for guided alignment training (train.align_weight).
- `mtx align corpus --src F --tgt F`: eflomal's symmetrised alignments of any parallel text,
  Pharaoh lines.
- `mtx align score --src --tgt --gold --links`: AER, precision and recall against gold links.
- `mtx align transfer --checkpoint CK --src tagged --tgt plain`: a tagged source's markup and
  placeholders put onto its given plain translation (decode/transfer.py).

The model's own alignments come from `mtx translate --alignments`, `mtx score --alignments` and
`mtx serve` ("alignments": true).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx.cli.app import CkptOpt, ConfigOpt, JsonOpt, SetOpt, load, log, run
from mtx.cli.decoding import DeviceOpt, TgtLangOpt

align_app = typer.Typer(
    help="Word alignment: eflomal's of the training data (for guided training) or of any "
    "parallel text, and AER against gold links.",
    no_args_is_help=True,
)

SamplersOpt = Annotated[
    int, typer.Option(help="eflomal's parallel samplers (0: one a core, 2 to 8).")
]
ChunkOpt = Annotated[
    int, typer.Option(help="Pairs aligned together: memory is bounded by a chunk.")
]
SrcOpt = Annotated[Path, typer.Option(help="Source sentences, one a line (words: whitespace).")]
TgtOpt = Annotated[Path, typer.Option(help="Target sentences, one per source line.")]


@align_app.command()
def prepared(
    config: ConfigOpt = None,
    set: SetOpt = None,
    samplers: SamplersOpt = 0,
    chunk: ChunkOpt = 250_000,
) -> None:
    """Align the prepared training data with eflomal (both directions, grow-diag-final-and)
    into RUN/prepared/align, for train.align_weight."""
    from mtx.align.statistical import check_samplers
    from mtx.data.aligned import align_prepared

    run(check_samplers, samplers)
    cfg = load(config, set)
    path = run(align_prepared, cfg, chunk, samplers, log)
    log(f"alignments in {path}")


@align_app.command()
def corpus(
    src: SrcOpt,
    tgt: TgtOpt,
    output: Annotated[
        Path | None, typer.Option(help="Write the links here (whole or not at all).")
    ] = None,
    samplers: SamplersOpt = 0,
    chunk: ChunkOpt = 250_000,
) -> None:
    """Align a parallel text with eflomal: one line of Pharaoh links ('0-0 1-2', source-target
    word indices from 0) per pair, on stdout or into --output, read and aligned a chunk at a
    time."""
    from mtx.align.links import format_links, stream_pairs
    from mtx.align.statistical import align_pairs, check_samplers
    from mtx.files import atomic_write

    run(check_samplers, samplers)
    lines = (format_links(x) + "\n" for x in align_pairs(stream_pairs(src, tgt), chunk, samplers))
    if output is None:  # each chunk's lines as soon as it is aligned
        return run(lambda: sys.stdout.writelines(lines))
    run(atomic_write, output, lambda f: f.writelines(x.encode("utf-8") for x in lines))
    log(f"aligned into {output}")


@align_app.command()
def transfer(
    src: Annotated[Path, typer.Option(help="Tagged sources, one block of text a line.")],
    tgt: Annotated[Path, typer.Option(help="Their plain translations, one a line.")],
    checkpoint: CkptOpt = None,
    format: Annotated[
        str, typer.Option("--format", help="What a source line is: html, xml or paragraphs.")
    ] = "html",
    output: Annotated[
        Path | None, typer.Option(help="Write the tagged translations here (whole or not at all).")
    ] = None,
    tgt_lang: TgtLangOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Put each tagged source's markup and placeholders onto its given plain translation (a
    person's, or post-edited), placed through the model's word alignment of the pair: one
    tagged translation a line, on stdout or into --output. The translation's words are kept
    as given; what the parser repaired in a source is said on stderr."""
    from mtx.align.links import corpus as read_corpus
    from mtx.cli.decoding import _translator
    from mtx.decode.transfer import Transfer
    from mtx.files import atomic_write_text

    sources, targets = run(read_corpus, src, tgt)
    translator = _translator(checkpoint, config, set, device)
    placing = run(Transfer, translator.parts, format, tgt_lang)
    done = run(placing.lines, sources, targets)
    for _, notes in done:
        for note in notes:
            log(note)
    text = "".join(line + "\n" for line, _ in done)
    if output is None:
        sys.stdout.write(text)
        return
    run(atomic_write_text, output, text)
    log(f"{len(done):,} tagged translations in {output}")


@align_app.command()
def score(
    src: SrcOpt,
    tgt: TgtOpt,
    gold: Annotated[Path, typer.Option(help="Gold links: i-j sure, ipj possible.")],
    links: Annotated[Path, typer.Option(help="The links to score, Pharaoh (i-j from 0).")],
    gold_from: Annotated[
        int, typer.Option(help="What the gold file counts words from: 1 (RWTH's .talp) or 0.")
    ] = 1,
    reverse: Annotated[
        bool,
        typer.Option(
            "--reverse", help="--links are target-source (a model translating --tgt to --src)."
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Alignment error rate, precision and recall of --links against --gold (Och and Ney
    2003), both checked against the --src and --tgt sentences."""
    from mtx.align import aer
    from mtx.align.links import corpus as read_corpus
    from mtx.align.links import read_links
    from mtx.cli.app import fail

    if gold_from not in (0, 1):
        fail(f"--gold-from must be 0 or 1, got {gold_from}")
    sources, targets = run(read_corpus, src, tgt)
    truth = run(read_links, gold, sources, targets, True, gold_from == 1)
    given = (targets, sources) if reverse else (sources, targets)
    predicted = run(read_links, links, *given).sure
    if reverse:
        predicted = aer.reverse(predicted)
    result = run(aer.score, predicted, truth)
    if json_out:
        typer.echo(json.dumps(result.to_json()))
    else:
        typer.echo(
            f"AER {100 * result.aer:.2f}  precision {100 * result.precision:.2f}  recall "
            f"{100 * result.recall:.2f}  ({result.pairs} pairs, {result.links:,} links)"
        )
