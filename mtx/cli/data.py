"""`mtx prepare` and `mtx toy`: the data."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx.cli.app import ConfigOpt, SetOpt, fail, load, log, run


def fetch(
    name: Annotated[str, typer.Argument(help="The corpus: multi30k.")],
    output: Annotated[
        Path | None, typer.Option(help="The folder to write (default: data/NAME).")
    ] = None,
    base: Annotated[
        str | None, typer.Option(help="Another address for its files (a mirror).")
    ] = None,
) -> None:
    """Download a public corpus (checked by SHA-256) into plain-text files that configs read."""
    from mtx.data.fetch import fetch as do_fetch

    folder = output or Path("data") / name
    paths = run(do_fetch, name, folder, base, log=log)
    log(f"{name}: {len(paths)} files in {folder}")


def prepare(config: ConfigOpt = None, set: SetOpt = None) -> None:
    """Load, clean, learn SentencePiece BPE and encode the data into RUN/prepared."""
    from mtx.data.prepare import prepare as do_prepare

    cfg = load(config, set)
    if not sys.stderr.isatty():  # a log file gets mtx's own lines, not datasets' bars
        import datasets

        datasets.disable_progress_bars()
    dual = None
    if cfg.data.clean.dual_forward:  # its models loaded (or refused) before any work
        from mtx.jobs.dual import DualCrossEntropy

        dual = run(DualCrossEntropy, cfg.data.clean)
        run(dual.check, cfg.data)
    run(do_prepare, cfg, log=log, dual=dual)


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
