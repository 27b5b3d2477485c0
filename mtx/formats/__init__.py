"""Outside formats, one module each, both directions in it: MarianMT (OPUS-MT: marian.py),
M2M100 (NLLB-200: m2m100.py), and CTranslate2 (ct2.py, export only); weights.py is the weight
names the first two share. This module is the registry and the two commands over them:

- `mtx import` (`import_model`): a Hugging Face model directory or hub id becomes an mtx
  checkpoint that every command takes; its `model_type` names the format (`IMPORTS`).
- `mtx export` (`export`): a checkpoint into a format: `hf` gives back the family it came
  from (a checkpoint's vocabulary says it: data/vocab.py's `family`; mtx's own models are
  MarianMT's shape), `ctranslate2` a CTranslate2 directory.

- `hf`: a Hugging Face `transformers` MarianMT directory (marian.py).
- `ctranslate2`: a CTranslate2 model directory (ct2.py).

Both hold the paper's Transformer and the students' narrower decoder feed-forward layers
(`model.decoder_d_ff`); neither holds the SSRU decoder layer (`model.decoder_self: ssru`),
pre-norm, learned or relative positions, or the recurrent baseline: those are refused, in one
line (docs/export.md has the table).

The directory is written beside its final name and renamed when complete, so an export that
fails leaves nothing. It also gets `mtx.json`: the checkpoint's config, data manifest, step
and mtx version, so an exported model still says what it is, and a multilingual model's
target-language tags (mtx/corpora.py): `>>de<< text` to MarianTokenizer, the piece `>>de<<`
first in CTranslate2's source tokens.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from mtx import __version__, corpora
from mtx.checkpoint import Checkpoint
from mtx.config import ModelConfig
from mtx.data import vocab
from mtx.errors import MtxError
from mtx.files import sha256_file
from mtx.formats import ct2, m2m100, marian
from mtx.model.build import checkpoint_model
from mtx.model.decoder_self import decoder_self


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
    if output.exists():
        raise MtxError(f"{output} already exists: remove it or choose another --output")
    directory = resolve(source)
    config = read_config(directory)
    kind = config.get("model_type")
    if kind not in IMPORTS:
        raise MtxError(
            f"{directory}: model_type {kind!r} cannot be imported (mtx imports MarianMT "
            "models, 'marian', and NLLB's M2M100, 'm2m_100')"
        )
    ckpt, about = IMPORTS[kind](directory, config, src_lang, tgt_lang)
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


FORMATS = ("hf", "ctranslate2")
# --format hf of a checkpoint of each family (data/vocab.py): where it came from, or MarianMT
HF_EXPORTS = {"mtx": marian.export_hf, "marian": marian.export_hf, "nllb": m2m100.export_m2m100}
# mtx import of each Hugging Face model_type
IMPORTS = {"marian": marian.convert, "m2m_100": m2m100.convert}


PAPER_ARCHITECTURE = {"arch": "transformer", "norm": "post", "positions": "sinusoidal"}


# an imported NLLB model's: pre-norm stacks and fairseq's table (hf: M2M100 again)
NLLB_ARCHITECTURE = {"arch": "transformer", "norm": "pre", "positions": "fairseq"}


def refusal(m: ModelConfig, fmt: str) -> str | None:
    """Why format `fmt` cannot hold a model of `m` (None: it can)."""
    arch = {k: getattr(m, k) for k in PAPER_ARCHITECTURE}
    if arch not in (PAPER_ARCHITECTURE, NLLB_ARCHITECTURE):
        found = ", ".join(f"model.{k}={v}" for k, v in arch.items())
        return (
            "export supports the paper's Transformer (post-norm, sinusoidal positions) and "
            f"an imported NLLB model (pre-norm, fairseq positions) only; this model has {found}"
        )
    kind = decoder_self(m)  # model/decoder_self.py
    if fmt not in kind.exports:
        return (
            f"--format {fmt} has no {kind.label} decoder layer (model.decoder_self="
            f"{m.decoder_self}); mtx translate and mtx serve run this model"
        )
    return None


def export(
    path: Path, fmt: str, output: Path, quantization: str | None = None
) -> dict[str, object]:
    if fmt not in FORMATS:
        raise MtxError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantization is not None and fmt != "ctranslate2":
        raise MtxError("--quantization applies to --format ctranslate2 only")
    if output.exists():
        raise MtxError(f"{output} already exists: remove it or choose another --output")
    ckpt = Checkpoint.load(path)
    cfg = ckpt.settings()
    why = refusal(cfg.model, fmt)
    if why:
        raise MtxError(f"{path}: {why}")
    model, spm_proto = checkpoint_model(ckpt, cfg, path), ckpt.spm_model
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if fmt == "hf":
            family = vocab.load(spm_proto).family  # the checkpoint says where it came from
            with _quiet_transformers():
                HF_EXPORTS[family](model, cfg, spm_proto, tmp)
        else:
            ct2.export_ct2(model, cfg, spm_proto, tmp, quantization)
        about = {
            "exported_by": f"mtx {__version__}",
            "format": fmt if quantization is None else f"{fmt} ({quantization})",
            "checkpoint": str(path),
            "checkpoint_sha256": sha256_file(path),  # serve's cached export checks it
            "step": ckpt.step,
            "trained_by": f"mtx {ckpt.mtx_version}",
            "averaged_from": _sources(ckpt),
            "config": ckpt.config.to_dict(),
            "manifest": None if ckpt.manifest is None else ckpt.manifest.to_dict(),
            # a multilingual model: the source starts with the target language's tag, as
            # MarianTokenizer reads ">>de<< text" and CTranslate2 takes the piece ">>de<<"
            "target_language_tags": corpora.tags(cfg.data),
        }
        (tmp / "mtx.json").write_text(json.dumps(about, indent=2) + "\n")
        tmp.rename(output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return about


def _sources(ckpt: Checkpoint) -> list[dict] | None:
    """What an averaged checkpoint was averaged from, as JSON."""
    if ckpt.averaged_from is None:
        return None
    return [{"path": s.path, "step": s.step} for s in ckpt.averaged_from]


def exported_from(directory: Path) -> str | None:
    """The sha256 of the checkpoint an export directory was made from (None: it does not say,
    as exports made before mtx recorded it)."""
    try:
        return json.loads((directory / "mtx.json").read_text()).get("checkpoint_sha256")
    except (OSError, ValueError):
        return None


def ct2_export_of(checkpoint: Path, directory: Path, owned: bool) -> None:
    """A CTranslate2 export of `checkpoint` in `directory`: made if missing, kept if it was
    made from this checkpoint (the sha256 its mtx.json records). One made from another
    checkpoint, or one that does not say, is made again when mtx chose the directory
    (`owned`), and refused in one line otherwise: a changed checkpoint is never served by a
    stale export."""
    if directory.exists() and not (directory / "model.bin").is_file():
        raise MtxError(f"{directory} exists but holds no CTranslate2 model (model.bin)")
    if (directory / "model.bin").is_file():
        recorded, current = exported_from(directory), sha256_file(checkpoint)
        if recorded == current:
            return
        if not owned:
            was = f"sha256 {recorded[:12]}" if recorded else "an unrecorded checkpoint"
            raise MtxError(
                f"{directory} was exported from another checkpoint ({was}) than {checkpoint} "
                f"(sha256 {current[:12]}): remove it or export again"
            )
        stale = directory.with_name(directory.name + ".stale")
        shutil.rmtree(stale, ignore_errors=True)
        directory.rename(stale)  # out of the way, whole, until the new export is complete
        try:
            export(checkpoint, "ctranslate2", directory)
        finally:
            shutil.rmtree(stale, ignore_errors=True)
        return
    export(checkpoint, "ctranslate2", directory)


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
