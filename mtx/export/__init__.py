"""`mtx export`: a checkpoint into another inference stack's format.

- `hf`: a Hugging Face `transformers` MarianMT directory (marian.py).
- `ctranslate2`: a CTranslate2 model directory (ct2.py).

The directory is written beside its final name and renamed when complete, so an export that
fails leaves nothing. It also gets `mtx.json`: the checkpoint's config, data manifest, step
and mtx version, so an exported model still says what it is.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from mtx import __version__, checkpoint
from mtx.errors import MtxError

FORMATS = ("hf", "ctranslate2")


PAPER_ARCHITECTURE = {"arch": "transformer", "norm": "post", "positions": "sinusoidal"}


def export(
    path: Path, fmt: str, output: Path, quantization: str | None = None
) -> dict[str, object]:
    if fmt not in FORMATS:
        raise MtxError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantization is not None and fmt != "ctranslate2":
        raise MtxError("--quantization applies to --format ctranslate2 only")
    if output.exists():
        raise MtxError(f"{output} already exists: remove it or choose another --output")
    ckpt = checkpoint.load(path)
    arch = {k: ckpt["config"]["model"].get(k, v) for k, v in PAPER_ARCHITECTURE.items()}
    if arch != PAPER_ARCHITECTURE:
        found = ", ".join(f"model.{k}={v}" for k, v in arch.items())
        raise MtxError(
            f"{path}: export supports the paper's Transformer only (post-norm, sinusoidal "
            f"positions); this model has {found}"
        )
    model, cfg, spm_proto = checkpoint.build_model(ckpt, path)
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if fmt == "hf":
            from mtx.export.marian import export_hf

            with _quiet_transformers():
                export_hf(model, cfg, spm_proto, tmp)
        else:
            from mtx.export.ct2 import export_ct2

            export_ct2(model, cfg, spm_proto, tmp, quantization)
        about = {
            "exported_by": f"mtx {__version__}",
            "format": fmt if quantization is None else f"{fmt} ({quantization})",
            "checkpoint": str(path),
            "step": ckpt.get("step"),
            "trained_by": f"mtx {ckpt.get('mtx_version')}",
            "averaged_from": ckpt.get("averaged_from"),
            "config": ckpt["config"],
            "manifest": ckpt.get("manifest"),
        }
        (tmp / "mtx.json").write_text(json.dumps(about, indent=2) + "\n")
        tmp.rename(output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return about


class _quiet_transformers:
    """Silence transformers' progress bars and its advice to install sacremoses (MarianTokenizer
    only uses it for a language-specific punctuation normalizer that mtx's exports do not set)."""

    def __enter__(self):
        try:
            from transformers.utils import logging
        except ImportError:
            raise MtxError(
                "--format hf needs the transformers package: pip install 'mtx[export]'"
            ) from None
        logging.disable_progress_bar()
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message=".*sacremoses.*")

    def __exit__(self, *exc):
        from transformers.utils import logging

        logging.enable_progress_bar()
        self._warnings.__exit__(*exc)
