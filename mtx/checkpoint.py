"""The files a run is made of: its directory (`RunDir`) and its checkpoints (`Checkpoint`).

This is the one module that knows a checkpoint's keys, a run directory's file names and the
keys of a data manifest; every other module reads fields. It sits on a bottom floor: it
imports the config and nothing of the model, the data or training.

A checkpoint is saved with `torch.save` and read only with `weights_only=True` (no code in a
checkpoint ever runs). It describes itself: the resolved config, the SentencePiece model, the
data manifest (what `mtx prepare` read and kept, with hashes) and the mtx version, so
`translate`, `evaluate`, `export` and `info` need nothing but the checkpoint; the run's
position (step, data position, best validation so far); and, in a resumable checkpoint, the
optimizer, the loss scale and the RNG state of every process. Its format has a version: a
checkpoint of a newer format than this mtx knows is refused in one line, and every older one
keeps loading (tests/fixtures holds one written by the first format).

A run directory holds:

    config.yaml        the resolved config of the last `mtx train`
    prepared/          `mtx prepare`'s output (data/prepare.py): spm.model, spm.vocab,
                       manifest.json, and one `datasets` folder per split
    checkpoints/       last.pt (resumable), best.pt (weights of the best validation by
                       train.best_metric) and the last train.keep_last step-N.pt (resumable,
                       what `mtx average --last` reads)
    metrics.jsonl      one JSON record per log line and validation
    tensorboard/       the same as TensorBoard scalars (train.tensorboard)
    valid.hyp          the last validation's translations
    curves.png         `mtx plot`'s picture

Files are written atomically (files.py): a crash leaves the previous file or the new one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtx import __version__
from mtx.config import PARTS, Config, apply_overrides, from_dict
from mtx.errors import MtxError
from mtx.files import atomic_write

FORMAT_NAME = "mtx-checkpoint"
FORMAT_VERSION = 1  # what this mtx writes, and the newest it reads


@dataclass(frozen=True)
class PreparedFiles:
    """RUN/prepared (data/prepare.py writes it into a temporary folder, then renames it)."""

    dir: Path

    @property
    def spm_model(self) -> Path:
        return self.dir / "spm.model"

    @property
    def spm_vocab(self) -> Path:
        return self.dir / "spm.vocab"

    @property
    def manifest(self) -> Path:
        return self.dir / "manifest.json"

    @property
    def cache(self) -> Path:
        return self.dir / "cache"

    @property
    def dropped(self) -> Path:
        """Every pair the cleaning dropped, with its reason (data/filtering.py)."""
        return self.dir / "dropped.tsv"

    def split(self, name: str) -> Path:
        """A split's `datasets` folder: train, valid or test."""
        return self.dir / name


@dataclass(frozen=True)
class RunDir:
    """Where a run's files live (see the module's docstring)."""

    root: Path

    @classmethod
    def of(cls, cfg: Config) -> RunDir:
        return cls(Path(cfg.run_dir))

    @property
    def prepared(self) -> Path:
        return self.root / "prepared"

    @property
    def data(self) -> PreparedFiles:
        """The files of `mtx prepare`'s output."""
        return PreparedFiles(self.prepared)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    def step(self, n: int) -> Path:
        return self.checkpoints / f"step-{n}.pt"

    def steps(self) -> list[Path]:
        """The step-N.pt files, newest (highest N) first."""
        return step_checkpoints(self.checkpoints)

    def prune(self, keep: int) -> None:
        """Delete all but the newest `keep` step checkpoints."""
        for path in self.steps()[keep:]:
            path.unlink(missing_ok=True)

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def valid_hyp(self) -> Path:
        return self.root / "valid.hyp"

    @property
    def curves(self) -> Path:
        return self.root / "curves.png"


def step_checkpoints(directory: Path) -> list[Path]:
    """The step-N.pt files in `directory`, newest (highest N) first."""
    found = []
    for path in directory.glob("step-*.pt"):
        match = re.fullmatch(r"step-(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


@dataclass
class SpmSource:
    """Where a run's SentencePiece model came from."""

    kind: str  # trained (by `mtx prepare`), sentencepiece (a .model file) or checkpoint
    path: str | None = None  # data.spm_model, resolved (not for a trained one)
    file_sha256: str | None = None  # of that file

    def to_dict(self) -> dict[str, Any]:
        out = {"path": self.path, "kind": self.kind, "file_sha256": self.file_sha256}
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class SetRecord:
    """One part of a prepared split: a corpus's training data, or a named validation or test
    set (the prepared `group` column numbers them in this order)."""

    name: str
    src_lang: str | None
    tgt_lang: str | None  # what the set is translated into (None: the model's one language)
    source: str  # the split's spec: a prefix, hf:NAME, toy:SPLIT
    files: dict[str, str]  # local files read: path -> sha256
    read: int  # pairs read
    kept: int  # pairs kept
    dropped: dict[str, int]  # pairs dropped, by reason


@dataclass
class SplitRecord:
    """One prepared split (train, valid or test): its parts one after the other."""

    source: str  # the parts' specs, "; "-separated
    files: dict[str, str]
    read: int
    kept: int
    dropped: dict[str, int]
    pairs_sha256: str  # of the kept pairs as "src\ttgt\n" lines, in order
    sets: list[SetRecord] = field(default_factory=list)  # empty: prepared before named sets


@dataclass
class Manifest:
    """What `mtx prepare` read and kept (RUN/prepared/manifest.json; every checkpoint of the
    run carries a copy)."""

    mtx_version: str
    src_lang: str | None  # one direction's languages (None with data.corpora)
    tgt_lang: str | None
    vocab_size: int
    spm_sha256: str  # of spm.model
    spm_source: SpmSource
    tags: dict[str, int]  # target language -> its tag's id ({}: one target language)
    splits: dict[str, SplitRecord]  # train, valid and, if there is one, test

    def to_dict(self) -> dict[str, Any]:
        """As manifest.json and checkpoints hold it."""
        out = dataclasses.asdict(self)
        out["spm_source"] = self.spm_source.to_dict()
        return out

    def write(self, path: Path) -> None:
        """manifest.json (written as part of `mtx prepare`'s temporary folder)."""
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> Manifest:
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """From manifest.json or a checkpoint, of this mtx or an older one."""
        splits = {}
        for name, split in d["splits"].items():
            sets = [SetRecord(**s) for s in split.get("sets") or []]
            splits[name] = SplitRecord(**{**split, "sets": sets})
        return cls(
            mtx_version=d.get("mtx_version", "unknown"),
            src_lang=d.get("src_lang"),
            tgt_lang=d.get("tgt_lang"),
            vocab_size=d["vocab_size"],
            spm_sha256=d["spm_sha256"],
            spm_source=SpmSource(**d["spm_source"]),
            tags=d.get("tags") or {},
            splits=splits,
        )


@dataclass
class Position:
    """Where a run stands, saved in every checkpoint it writes."""

    step: int = 0  # updates done
    epoch: int = 0  # current pass over the data
    batch: int = 0  # batches of the current epoch already consumed
    best_valid_loss: float = math.inf
    best_valid_bleu: float = -math.inf
    best_step: int = 0  # the step of the best validation by train.best_metric
    stale: int = 0  # validations since then that measured train.best_metric (train.patience)


@dataclass
class Resume:
    """What a resumable checkpoint (last.pt, step-N.pt) holds beyond the weights."""

    optimizer: dict[str, Any]  # Adam's state_dict
    scaler: dict[str, Any] | None  # fp16's loss scaler, None for other precisions
    process_rngs: list[tuple[Tensor, list[Tensor]]]  # (CPU, CUDA) RNG states of each process
    # train.ema: the trained weights (the checkpoint's `model` is then their moving average)
    raw_model: dict[str, Tensor] | None = None


@dataclass
class InitRecord:
    """train.init_from: the checkpoint a fine-tuning run started from."""

    path: str
    sha256: str  # of its file
    step: int | None
    kept: list[str]  # what was kept beside the weights: "optimizer", "step"
    parts: list[str] = field(default_factory=lambda: list(PARTS))  # whose weights were taken


@dataclass
class Source:
    """One checkpoint that an average was taken over."""

    path: str
    step: int | None


@dataclass
class Checkpoint:
    """A checkpoint: the weights and everything needed to use them, or to resume a run."""

    config: Config  # the resolved config of the run
    spm_model: bytes  # the SentencePiece model proto
    vocab_size: int
    model: dict[str, Tensor]  # the model's state_dict
    manifest: Manifest | None = None  # RUN/prepared/manifest.json of the data
    position: Position = field(default_factory=Position)
    init_from: InitRecord | None = None
    averaged_from: list[Source] | None = None
    resume: Resume | None = None  # None: weights only (best.pt, an average)
    mtx_version: str = __version__  # of the mtx that wrote it

    @property
    def step(self) -> int:
        return self.position.step

    def settings(self, overrides: list[str] | None = None) -> Config:
        """Its config, with `overrides` (key=value) applied, validated (a copy: the
        checkpoint's own stays as it was)."""
        return apply_overrides(copy.deepcopy(self.config), overrides).validate()

    def save(self, path: Path) -> None:
        payload = _to_payload(self)
        atomic_write(path, lambda f: torch.save(payload, f))

    @classmethod
    def load(cls, path: str | Path) -> Checkpoint:
        """Read a checkpoint through the safe loader; MtxError in one line if it cannot be."""
        path = Path(path)
        if not path.is_file():
            raise MtxError(f"checkpoint not found: {path}")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MtxError(f"{path}: not a loadable mtx checkpoint ({first[:200]})") from None
        return _from_payload(payload, path)


def read_tensors(path: Path) -> dict[str, Tensor]:
    """Another toolkit's weights (a pretrained model's, mtx/formats/): a .safetensors
    file, or a PyTorch pickle through the safe loader (weights_only: never an unsafe
    unpickling); MtxError in one line if they cannot be read."""
    try:
        if path.suffix == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError:
                need = "reading it needs safetensors: pip install 'mtx[import]'"
                raise MtxError(f"{path}: {need}") from None
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except MtxError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise MtxError(f"{path}: its weights cannot be read ({first})") from None


# --- the format on disk: the only place that knows its keys --------------------------------


def _to_payload(c: Checkpoint) -> dict[str, Any]:
    p = c.position
    payload: dict[str, Any] = {
        "format": f"{FORMAT_NAME}-{FORMAT_VERSION}",
        "mtx_version": __version__,
        "config": c.config.to_dict(),
        "spm_model": c.spm_model,
        "vocab_size": c.vocab_size,
        "manifest": None if c.manifest is None else c.manifest.to_dict(),
        "model": c.model,
        "step": p.step,
        "epoch": p.epoch,
        "batch": p.batch,
        "best_valid_loss": p.best_valid_loss,
        "best_valid_bleu": p.best_valid_bleu,
        "best_step": p.best_step,
        "stale_validations": p.stale,
        "init_from": dataclasses.asdict(c.init_from) if c.init_from else None,
    }
    if c.averaged_from is not None:
        payload["averaged_from"] = [dataclasses.asdict(s) for s in c.averaged_from]
    if c.resume is not None:
        r = c.resume
        payload |= {
            "optimizer": r.optimizer,
            "scaler": r.scaler,
            "rng": r.process_rngs[0][0],  # rank 0's, as the first format's readers expect
            "cuda_rng": r.process_rngs[0][1],
            "process_rngs": r.process_rngs,
        }
        if r.raw_model is not None:
            payload["raw_model"] = r.raw_model
    return payload


def format_version(payload: Any, path: Path) -> int:
    """The format version a loaded payload says it has; MtxError if it is not a checkpoint or
    comes from a newer mtx."""
    name = payload.get("format") if isinstance(payload, dict) else None
    match = re.fullmatch(rf"{FORMAT_NAME}-(\d+)", name) if isinstance(name, str) else None
    if match is None:
        raise MtxError(f"{path}: not an mtx checkpoint (format {FORMAT_NAME}-N expected)")
    version = int(match.group(1))
    if version > FORMAT_VERSION:
        raise MtxError(
            f"{path}: checkpoint format {version} comes from a newer mtx "
            f"({payload.get('mtx_version')}); this mtx {__version__} reads format "
            f"{FORMAT_VERSION} and older: upgrade mtx"
        )
    return version


def _from_payload(payload: Any, path: Path) -> Checkpoint:
    format_version(payload, path)
    missing = [k for k in ("config", "spm_model", "vocab_size", "model") if k not in payload]
    if missing:
        raise MtxError(f"{path}: an incomplete mtx checkpoint (no {missing[0]})")
    get = payload.get
    position = Position(
        step=get("step") or 0,
        epoch=get("epoch", 0),
        batch=get("batch", 0),
        best_valid_loss=get("best_valid_loss", math.inf),
        best_valid_bleu=get("best_valid_bleu", -math.inf),
        best_step=get("best_step", 0),
        stale=get("stale_validations", 0),
    )
    resume = None
    if "optimizer" in payload:
        rngs = get("process_rngs") or [(payload["rng"], payload["cuda_rng"])]
        resume = Resume(
            payload["optimizer"], get("scaler"), [tuple(r) for r in rngs], get("raw_model")
        )
    init, averaged, manifest = get("init_from"), get("averaged_from"), get("manifest")
    try:
        config = from_dict(_older_config(payload["config"]))
    except MtxError as e:
        raise MtxError(f"{path}: its config: {e}") from None
    return Checkpoint(
        config=config,
        spm_model=payload["spm_model"],
        vocab_size=payload["vocab_size"],
        model=payload["model"],
        manifest=Manifest.from_dict(manifest) if manifest else None,
        position=position,
        init_from=InitRecord(**init) if init else None,
        averaged_from=[Source(**s) for s in averaged] if averaged is not None else None,
        resume=resume,
        mtx_version=get("mtx_version") or "unknown",
    )


def _older_config(config: Any) -> Any:
    """A config as this mtx reads it where a setting's default changed after the checkpoint
    was written: a guided model written before train.align_context was trained in the causal
    pass (the default is now full)."""
    train = config.get("train") if isinstance(config, dict) else None
    if isinstance(train, dict) and train.get("align_weight") and "align_context" not in train:
        return config | {"train": train | {"align_context": "causal"}}
    return config


# --- averaging (the paper's section 6.1) --------------------------------------------------


def last_step_checkpoints(run: Path, n: int) -> list[Path]:
    """The `n` newest step-N.pt of a run directory (or of its checkpoints directory)."""
    directory = RunDir(run).checkpoints if RunDir(run).checkpoints.is_dir() else run
    found = step_checkpoints(directory)
    if not found:
        raise MtxError(f"no step-N.pt checkpoints in {directory}")
    if len(found) < n:
        raise MtxError(
            f"--last {n} asks for more checkpoints than {directory} holds ({len(found)}; "
            "train.keep_last sets how many a run keeps)"
        )
    return found[:n]


def average(paths: list[Path], raw: bool = False) -> Checkpoint:
    """A weights-only checkpoint whose parameters are the mean of those of `paths`.
    Checkpoints are read one at a time (memory holds one plus the float64 sums). They must
    share the model config and the vocabulary; config, vocabulary and data manifest are taken
    from the newest (highest step). With `raw`, the weights that a run with `train.ema`
    trained (kept beside the moving average in its resumable checkpoints) are averaged
    instead: those of the same run without the average."""
    if not paths:
        raise MtxError("no checkpoints to average")
    sums: dict[str, Tensor] = {}
    first = newest = None
    sources = []
    for path in paths:
        ckpt = Checkpoint.load(path)
        weights = _raw_weights(path, ckpt) if raw else ckpt.model
        ckpt.model, ckpt.resume = {}, None  # let the optimizer state go
        if first is None:
            first = ckpt
            sums = {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}
            dtypes = {k: v.dtype for k, v in weights.items()}
        else:
            _check_averageable(path, paths[0], ckpt, first, weights, sums)
            for name, tensor in weights.items():
                if tensor.is_floating_point():
                    sums[name] += tensor.double()
        if newest is None or ckpt.step > newest.step:
            newest = ckpt
        sources.append(Source(str(path), ckpt.step))
    model = {
        k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v for k, v in sums.items()
    }
    return Checkpoint(
        config=newest.config,
        spm_model=newest.spm_model,
        vocab_size=newest.vocab_size,
        model=model,
        manifest=newest.manifest,
        position=Position(step=newest.step),
        averaged_from=sources,
    )


def _raw_weights(path: Path, ckpt: Checkpoint) -> dict[str, Tensor]:
    if ckpt.resume is None or ckpt.resume.raw_model is None:
        raise MtxError(
            f"{path}: holds no raw weights (only the resumable checkpoints of a run with "
            "train.ema do: last.pt, step-N.pt)"
        )
    return ckpt.resume.raw_model


def _check_averageable(path, first_path, ckpt, first, weights, sums) -> None:
    if ckpt.config.model != first.config.model or weights.keys() != sums.keys():
        raise MtxError(f"{path}: another model than {first_path}; cannot average")
    if (ckpt.spm_model, ckpt.vocab_size) != (first.spm_model, first.vocab_size):
        raise MtxError(f"{path}: another vocabulary than {first_path}; cannot average")
    for name, tensor in weights.items():
        if not tensor.is_floating_point() and not torch.equal(tensor, sums[name]):
            raise MtxError(f"{path}: {name} differs and is not a float; cannot average")
