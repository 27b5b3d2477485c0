"""`mtx score`: the log-probability a model gives each (source, target) pair (decode/score.py);
`mtx distill`: a teacher's translations of a corpus, scored and filtered (jobs/distill.py);
`mtx shortlist`: a lexical shortlist from a run's prepared data (decode/shortlist.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx.cli.app import CkptOpt, ConfigOpt, JsonOpt, SetOpt, checkpoint_paths, fail, log, run
from mtx.cli.decoding import (
    BatchOpt,
    BeamOpt,
    ChunkOpt,
    DeviceOpt,
    DtypeOpt,
    ResumeOpt,
    TgtLangOpt,
    _options,
    _translator,
    processes,
    read_lines,
    refuse_stream_under_torchrun,
)
from mtx.errors import MtxError


def read_pairs(src: Path | None, tgt: Path | None) -> tuple[list[str], list[str]]:
    """The pairs to score: lines of `src` and `tgt` side by side, or tab-separated pairs from
    stdin. Refused in one line: a missing file, unequal line counts, a stdin line without a tab."""
    from mtx.data.sources import read_lines as read_file_lines

    if (src is None) != (tgt is None):
        raise MtxError("--src and --tgt go together (or neither: tab-separated pairs on stdin)")
    if src is not None and tgt is not None:
        for path in (src, tgt):
            if not path.is_file():
                raise MtxError(f"file not found: {path}")
        sources, targets = list(read_file_lines(src)), list(read_file_lines(tgt))
        if len(sources) != len(targets):
            raise MtxError(
                f"{src} has {len(sources)} lines but {tgt} has {len(targets)}: they must pair up"
            )
        return sources, targets
    sources, targets = [], []
    for number, line in enumerate(read_lines(sys.stdin.buffer), 1):
        source, tab, target = line.partition("\t")
        if not tab:
            raise MtxError(f"stdin line {number}: no tab between the source and the target")
        sources.append(source)
        targets.append(target)
    return sources, targets


PerTokenOpt = Annotated[
    bool, typer.Option("--per-token", help="Also each target token's log-probability.")
]
ScoreAlignOpt = Annotated[
    bool,
    typer.Option(
        "--alignments",
        help="Also each pair's word alignment by the model (Pharaoh 'i-j', source-target "
        "word indices from 0; decode/align.py): mtx as a corpus aligner.",
    ),
]
ScoreOutputOpt = Annotated[
    Path | None,
    typer.Option(
        help="With --src and --tgt: write the scores here, chunk by chunk, with a progress "
        "bar; a killed run continues with --resume; under torchrun, spread over the processes."
    ),
]


def score(
    checkpoint: CkptOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    src: Annotated[
        Path | None, typer.Option(help="Source lines (with --tgt; without both: stdin).")
    ] = None,
    tgt: Annotated[Path | None, typer.Option(help="Target lines, one per source line.")] = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    tgt_lang: TgtLangOpt = None,
    json_out: JsonOpt = False,
    per_token: PerTokenOpt = False,
    alignments: ScoreAlignOpt = False,
    output: ScoreOutputOpt = None,
    resume: ResumeOpt = False,
    chunk_lines: ChunkOpt = 512,
) -> None:
    """Score (source, target) pairs by forced decoding: for each, the log-probability the model
    (or the ensemble of several --checkpoint) gives the target, as 'TOTAL<TAB>MEAN<TAB>TOKENS'
    (natural log; MEAN per target token, EOS included; with --alignments a fourth column of
    word links), or with --json one object per line.
    Pairs come from --src and --tgt, or as 'SOURCE<TAB>TARGET' lines on stdin."""
    if output is None:
        run(refuse_stream_under_torchrun, "mtx score", "--src, --tgt and --output")
    if (output is not None or resume) and (src is None or tgt is None):
        fail("--output and --resume take --src and --tgt (files: read again to resume)")
    if output is None:
        sources, targets = run(read_pairs, src, tgt)
    from mtx.decode.align import Aligner
    from mtx.decode.score import Scorer

    translator = _translator(checkpoint, config, set, device, batch_tokens=batch_tokens,
                             dtype=dtype)  # fmt: skip
    scorer = run(Scorer, translator.parts, tgt_lang)
    aligner = run(Aligner, translator.parts, tgt_lang) if alignments else None
    form = (json_out, per_token)
    if output is not None:
        from mtx.jobs.corpus import Record

        reads = {"tgt": str(tgt.resolve()), "tgt_bytes": tgt.stat().st_size,
                 "tgt_lang": tgt_lang, "json": json_out, "per_token": per_token,
                 "alignments": alignments}  # fmt: skip
        record = run(Record.of, src, translator.parts, None, list(set or []), reads)
        return _score_corpus((scorer, aligner), src, tgt, output, record, form,
                             (resume, chunk_lines))  # fmt: skip
    try:
        for line in score_lines((scorer, aligner), sources, targets, form):
            sys.stdout.write(line)
        sys.stdout.flush()
    except BrokenPipeError:  # `mtx score ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _score_corpus(scoring, src, tgt, output, record, form, how) -> None:
    """--src and --tgt scored into --output (a corpus job: jobs/corpus.py, shards.py)."""
    from mtx.jobs.corpus import CorpusJob
    from mtx.jobs.translate import run_job

    if not tgt.is_file():
        fail(f"file not found: {tgt}")
    run(_check_targets, scoring[0], tgt)  # a target too long: refused before anything is written

    def render(first: int, rows: list[tuple[str, ...]]) -> list[str]:
        sources, targets = [r[0] for r in rows], [r[1] for r in rows]
        return run(score_lines, scoring, sources, targets, form, first)

    job = CorpusJob([src, tgt], record, 1, render, verb="scored", unit="pairs")
    done = run(run_job, job, output, *how)
    if done.main:
        log(f"scored {done.lines:,} pairs into {output}{processes(done)}")


def _check_targets(scorer, tgt: Path) -> None:
    from mtx.data.sources import read_lines as read_file_lines

    for number, line in enumerate(read_file_lines(tgt)):
        scorer.target_ids(line, number)


def score_lines(scoring, sources, targets, form, first: int = 0) -> list[str]:
    """Each pair's line: 'TOTAL<TAB>MEAN<TAB>TOKENS' (with the per-token log-probabilities
    and, with an aligner, the word links), or a JSON object (`scoring`: the scorer and the
    aligner or None; `form`: json, per token); `first`: the first pair's number from 0 (for
    errors)."""
    scorer, aligner = scoring
    json_out, per_token = form
    scores = scorer.score(sources, targets, first)
    links = None
    if aligner is not None:
        src = [scorer.parts.codec.encode(line, scorer.tgt_lang) for line in sources]
        tgt = [scorer.target_ids(line, first + n)[:-1] for n, line in enumerate(targets)]
        links = aligner.word_links(src, tgt)
    lines = []
    for n, s in enumerate(scores):
        if json_out:
            record = {"total": s.total, "mean": s.mean, "tokens": s.tokens}
            if per_token:
                record["per_token"] = s.per_token
            if links is not None:
                record["alignments"] = [list(link) for link in sorted(links[n])]
            lines.append(json.dumps(record) + "\n")
            continue
        line = f"{s.total:.6f}\t{s.mean:.6f}\t{s.tokens}"
        if per_token:
            line += "\t" + " ".join(f"{x:.6f}" for x in s.per_token)
        if links is not None:
            line += "\t" + " ".join(f"{i}-{j}" for i, j in sorted(links[n]))
        lines.append(line + "\n")
    return lines


RefOpt = Annotated[
    Path | None,
    typer.Option(
        help="The references of --src: each line's translation is then the one of the "
        "teacher's --nbest closest to its reference (--select)."
    ),
]


DistillSrcOpt = Annotated[Path | None, typer.Option(help="The training sources to translate.")]
OutputDirOpt = Annotated[
    Path | None, typer.Option(help="Where the translations and the corpus go.")
]
DropWorstOpt = Annotated[
    float, typer.Option(help="Drop this fraction of the pairs: those of highest cross-entropy.")
]


def distill(
    checkpoint: CkptOpt = None,
    config: ConfigOpt = None,
    set: SetOpt = None,
    src: DistillSrcOpt = None,
    output_dir: OutputDirOpt = None,
    drop_worst: DropWorstOpt = 0.05,
    ref: RefOpt = None,
    nbest: Annotated[int, typer.Option(help="With --ref: choose from the teacher's n best.")] = 8,
    select: Annotated[str, typer.Option(help="With --ref: bleu or chrf, by sentence.")] = "bleu",
    resume: ResumeOpt = False,
    beam: BeamOpt = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    tgt_lang: TgtLangOpt = None,
    chunk_lines: ChunkOpt = 512,
) -> None:
    """Sequence-level distillation data: the teacher (--checkpoint, several for an ensemble)
    translates --src (with --ref, into its --nbest best, of which each line keeps the closest to
    its reference), scores its translations and drops the --drop-worst fraction of highest
    cross-entropy; DIR/distilled.SRC and DIR/distilled.TGT are a corpus for `mtx prepare`
    (data.train: DIR/distilled), DIR/distill.json the counts and the threshold."""
    from mtx.jobs.distill import Selection, check, distill_job, finish, work_path
    from mtx.jobs.shards import parts_dir
    from mtx.jobs.translate import run_job

    if src is None or output_dir is None:
        fail("mtx distill needs --src and --output-dir")
    selection = None if ref is None else Selection(ref, nbest, select)
    run(check, src, selection, drop_worst)  # before the teacher is loaded
    from mtx.jobs.corpus import Record

    translator = _translator(checkpoint, config, set, device, batch_tokens=batch_tokens,
                             dtype=dtype)  # fmt: skip
    # before anything is written
    options = _options(translator, beam=beam, tgt_lang=tgt_lang, nbest=nbest if selection else 1)
    data = translator.parts.config.data
    langs = (data.src_lang, tgt_lang or data.tgt_lang)
    if not all(langs):
        fail("the teacher's config names no src_lang/tgt_lang: give --tgt-lang")
    paths = checkpoint_paths(checkpoint, config, set)
    reads = {} if selection is None else {"ref": str(ref.resolve()), "select": select}
    record = run(Record.of, src, translator.parts, options, list(set or []), reads)
    job = run(distill_job, translator, src, record, selection, options)
    work = work_path(output_dir, langs[1])
    run(output_dir.mkdir, parents=True, exist_ok=True)
    # a begun translation goes on (nothing more to do once finished)
    resume = resume or work.exists() or parts_dir(work).is_dir()
    done = run(run_job, job, work, resume, chunk_lines)
    if done.main:
        log(f"translated {done.lines:,} lines into {work}{processes(done)}")
        teacher = [str(Path(p).resolve()) for p in paths]
        result = run(finish, output_dir, langs, src, drop_worst, teacher, selection)
        report(result, langs, output_dir)


def report(r, langs: tuple[str, str], output_dir: Path) -> None:
    """What `mtx distill` did, in two lines on stderr."""
    above = r.threshold_cross_entropy
    threshold = "" if above is None else f" (cross-entropy above {above:.3f})"
    if (c := r.chosen) is not None:
        log(
            f"chose each translation of the teacher's {c.nbest} best closest to its reference: "
            f"{c.not_first:,} of {r.pairs:,} not its first; mean sentence {c.metric} "
            f"{c.mean_first:.2f} -> {c.mean_chosen:.2f}"
        )
    log(f"kept {r.kept:,} of {r.pairs:,} pairs, dropped {r.dropped:,}{threshold}")
    log(
        f"corpus: {r.corpus}.{{{langs[0]},{langs[1]}}} (data.train: {r.corpus}); "
        f"{output_dir / 'distill.json'}"
    )


def shortlist(
    config: ConfigOpt = None,
    set: SetOpt = None,
    top: Annotated[int, typer.Option(min=1, help="Target pieces kept for each source piece.")] = 50,
    frequent: Annotated[
        int, typer.Option(min=0, help="The most frequent target pieces, always candidates.")
    ] = 100,
    output: Annotated[
        Path | None, typer.Option(help="The file to write (default: RUN/shortlist.npz).")
    ] = None,
) -> None:
    """A lexical shortlist from the run's prepared training data: decode with it through
    decode.shortlist (`mtx translate --shortlist FILE`) to score only the target pieces
    likely for each sentence."""
    from mtx.checkpoint import RunDir
    from mtx.cli.app import load
    from mtx.jobs.shortlist import from_prepared

    cfg = load(config, set)
    path = output or RunDir.of(cfg).root / "shortlist.npz"
    built = run(from_prepared, cfg, top, frequent, log)
    run(built.save, path)
    log(f"wrote {path}")
