"""`mtx score`: the log-probability a model gives each (source, target) pair (decode/score.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx.cli.app import CkptOpt, ConfigOpt, JsonOpt, SetOpt, run
from mtx.cli.decoding import BatchOpt, DeviceOpt, DtypeOpt, TgtLangOpt, _translator, read_lines
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
    per_token: Annotated[
        bool, typer.Option("--per-token", help="Also each target token's log-probability.")
    ] = False,
) -> None:
    """Score (source, target) pairs by forced decoding: for each, the log-probability the model
    (or the ensemble of several --checkpoint) gives the target, as 'TOTAL<TAB>MEAN<TAB>TOKENS'
    (natural log; MEAN per target token, EOS included), or with --json one object per line.
    Pairs come from --src and --tgt, or as 'SOURCE<TAB>TARGET' lines on stdin."""
    from mtx.decode.score import Scorer

    sources, targets = run(read_pairs, src, tgt)
    translator = _translator(checkpoint, config, set, None, None, batch_tokens, device, tgt_lang,
                             dtype=dtype)  # fmt: skip
    scores = run(Scorer(translator).score, sources, targets)
    try:
        for s in scores:
            if json_out:
                record = {"total": s.total, "mean": s.mean, "tokens": s.tokens}
                if per_token:
                    record["per_token"] = s.per_token
                line = json.dumps(record)
            else:
                line = f"{s.total:.6f}\t{s.mean:.6f}\t{s.tokens}"
                if per_token:
                    line += "\t" + " ".join(f"{x:.6f}" for x in s.per_token)
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `mtx score ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
