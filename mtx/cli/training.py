"""`mtx train`, and what is done with its checkpoints: `average`, `info`, `plot`, `export`;
`import`, a checkpoint from a pretrained model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mtx.cli.app import ConfigOpt, JsonOpt, SetOpt, fail, load, log, run


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
    cfg = load(config, items)
    run(do_train, cfg, resume=resume, overwrite=overwrite, log=log)


def info(
    target: Annotated[str, typer.Argument(help="A YAML config or a checkpoint.")],
    set: SetOpt = None,
    length: Annotated[int, typer.Option(help="Tokens per side for the FLOPs figures.")] = 32,
    json_out: JsonOpt = False,
) -> None:
    """Architecture, parameter count and FLOPs per token."""
    from mtx.info import describe

    about = run(describe, target, set, length)
    typer.echo(json.dumps(about.to_json()) if json_out else "\n".join(about.lines()))


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
    from mtx.formats import export as do_export

    about = run(do_export, checkpoint, format, output, quantization)
    log(f"exported {checkpoint} (step {about['step']}) to {output} as {about['format']}")


def import_(
    source: Annotated[
        str,
        typer.Argument(
            help="A Hugging Face MarianMT (OPUS-MT) or NLLB (M2M100) model: its directory, "
            "or a hub id."
        ),
    ],
    output: Annotated[Path, typer.Option(help="The mtx checkpoint to write.")],
    src_lang: Annotated[str | None, typer.Option(help="Its source language code.")] = None,
    tgt_lang: Annotated[str | None, typer.Option(help="Its target language code.")] = None,
) -> None:
    """Turn a pretrained MarianMT (OPUS-MT) or NLLB (M2M100) model into an mtx checkpoint."""
    from mtx.formats import import_model

    about = run(import_model, source, output, src_lang, tgt_lang)
    log(f"imported {source} ({about}) to {output}")


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
    raw: Annotated[
        bool,
        typer.Option(
            help="Average the trained weights that a run with train.ema keeps beside the "
            "moving average (resumable checkpoints only): the run without the average."
        ),
    ] = False,
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
    averaged = run(ckpt.average, paths, raw)
    run(averaged.save, output)
    steps = ", ".join(str(s.step) for s in averaged.averaged_from)
    log(f"averaged {len(paths)} checkpoints (steps {steps}) into {output}")
