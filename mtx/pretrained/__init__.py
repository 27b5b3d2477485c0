"""`mtx import`: a pretrained model of another toolkit becomes an mtx checkpoint that every
command takes (translate, score, evaluate, serve, info, distill, export, train's
init_from). Hugging Face MarianMT models, the format of OPUS-MT (marian.py), and M2M100
models, the format of NLLB-200 (nllb.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mtx.errors import MtxError


def read_config(directory: Path) -> dict:
    """A Hugging Face model directory's config.json; refused in one line if there is none."""
    if not directory.is_dir():
        raise MtxError(f"{directory}: no such directory (a Hugging Face model's, downloaded)")
    path = directory / "config.json"
    if not path.is_file():
        raise MtxError(f"{directory}: no config.json: not a Hugging Face model directory")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MtxError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None


def import_model(source: str, output: Path, src_lang: str | None, tgt_lang: str | None) -> str:
    """Write the checkpoint `output` from `source` (a local model directory, or a hub id that
    huggingface_hub resolves); returns what was imported, in words. Nothing is written
    unless the whole import succeeds."""
    from mtx.pretrained import marian, nllb

    if output.exists():
        raise MtxError(f"{output} already exists: remove it or choose another --output")
    directory = resolve(source)
    config = read_config(directory)
    kind = config.get("model_type")
    families = {"marian": marian.convert, "m2m_100": nllb.convert}
    if kind not in families:
        raise MtxError(
            f"{directory}: model_type {kind!r} cannot be imported (mtx imports MarianMT "
            "models, 'marian', and NLLB's M2M100, 'm2m_100')"
        )
    ckpt, about = families[kind](directory, config, src_lang, tgt_lang)
    output.parent.mkdir(parents=True, exist_ok=True)
    ckpt.save(output)
    return about


def resolve(source: str) -> Path:
    """A local directory as it is; otherwise a hub id (owner/name), downloaded by
    huggingface_hub into its cache. Without the network, the error says what to download."""
    path = Path(source)
    if path.exists() or source.startswith((".", "/")) or source.count("/") != 1:
        return path
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.spm", "*.model", "*.safetensors", "pytorch_model.bin"]
        return Path(snapshot_download(source, allow_patterns=patterns))
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise MtxError(
            f"{source}: not a local directory, and the hub did not answer ({first}); on a "
            f"machine with the network run `hf download {source} --local-dir DIR`, then "
            "`mtx import DIR --output CHECKPOINT`"
        ) from None
