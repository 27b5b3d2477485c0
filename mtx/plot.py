"""Pictures: a run's training curves (`mtx plot`) and attention heatmaps (`mtx translate
--attention-dir`). matplotlib is an optional dependency: `pip install 'mtx[plot]'`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from mtx.checkpoint import RunDir
from mtx.errors import MtxError
from mtx.files import atomic_write, atomic_write_text
from mtx.train.metrics import read_metrics

if TYPE_CHECKING:
    from mtx.decode.result import Attention

# panel title -> (metrics.jsonl key, kind of record); BLEU appears only where a run logs it
CURVES = [
    ("loss (label-smoothed)", [("loss", "train"), ("valid_loss", "valid")]),
    ("perplexity", [("ppl", "train"), ("valid_ppl", "valid")]),
    ("BLEU and chrF", [("valid_bleu", "valid"), ("valid_chrf", "valid")]),
    ("learning rate", [("lr", "train")]),
    ("gradient norm", [("grad_norm", "train")]),
    ("tokens/s (source + target)", [("tokens_per_s", "train")]),
]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MtxError("pictures need matplotlib: pip install 'mtx[plot]'") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, output: Path) -> None:
    """Write the figure whole or not at all."""
    atomic_write(output, lambda f: fig.savefig(f, format="png"))


def plot_run(run_dir: Path, output: Path | None = None, dpi: int = 100) -> tuple[Path, list[str]]:
    """Draw RUN_DIR/metrics.jsonl into a PNG (one panel per curve the log holds); returns the
    file and the panels drawn."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        raise MtxError(f"{path}: no metrics log (is this a run directory?)")
    rows = read_metrics(path, strict=True)
    panels = []
    for title, series in CURVES:
        lines = []
        for key, kind in series:
            points = [(r["step"], r[key]) for r in rows if r.get("kind") == kind and key in r]
            if points:
                lines.append((f"{kind} {key}", points))
        if lines:
            panels.append((title, lines))
    if not panels:
        raise MtxError(f"{path}: no curves to draw")
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.5 * len(panels)), dpi=dpi, sharex=True)
    axes = axes if len(panels) > 1 else [axes]
    for ax, (title, lines) in zip(axes, panels):
        for label, points in lines:
            steps, values = zip(*points)
            ax.plot(steps, values, label=label, marker="o" if len(points) < 30 else None)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if title.startswith(("loss", "perplexity")):
            ax.set_yscale("log")
        ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("update")
    fig.tight_layout()
    output = output or RunDir(run_dir).curves
    _save(fig, output)
    plt.close(fig)
    return output, [title for title, _ in panels]


def attention_heatmap(
    weights, source: list[str], target: list[str], output: Path, title: str = "", dpi: int = 100
) -> None:
    """weights (len(target), len(source)): one output subword per row, one source per column."""
    plt = _pyplot()
    rows, cols = len(target), len(source)
    fig, ax = plt.subplots(figsize=(1 + 0.4 * max(cols, 4), 1 + 0.4 * max(rows, 4)), dpi=dpi)
    ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(cols), source, rotation=90)
    ax.set_yticks(range(rows), target)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    _save(fig, output)
    plt.close(fig)


def write_attention(
    directory: Path, number: int, record: Attention, every_head: bool = False
) -> None:
    """For input line `number` (from 1): NNNNNN.png, the attention averaged over decoder layers
    and heads, and NNNNNN.json with the subwords, that matrix and the alignment (for each
    output subword, the source subword it attends to most); with `every_head`, also
    NNNNNN.layerL.png (averaged over heads) and NNNNNN.layerL.headH.png, and the full
    (layers, heads, outputs, sources) weights in the JSON."""
    weights, mean = record.weights, record.mean()  # (L, H, T, S), (T, S)
    stem = f"{number:06d}"
    src, out = record.source, record.output
    attention_heatmap(mean.numpy(), src, out, directory / f"{stem}.png", f"line {number}")
    if every_head:
        for layer in range(weights.size(0)):
            name = f"{stem}.layer{layer + 1}"
            title = f"line {number}, layer {layer + 1}"
            attention_heatmap(
                weights[layer].mean(0).numpy(), src, out, directory / f"{name}.png", title
            )
            for head in range(weights.size(1)):
                attention_heatmap(
                    weights[layer, head].numpy(), src, out,
                    directory / f"{name}.head{head + 1}.png", f"{title}, head {head + 1}",
                )  # fmt: skip
    about = {
        "line": number,
        "source": src,
        "output": out,
        "attention": mean.tolist(),
        "alignment": mean.argmax(dim=1).tolist(),
    }
    if every_head:
        about["weights"] = weights.tolist()
    atomic_write_text(directory / f"{stem}.json", json.dumps(about) + "\n")
