"""Reading `mtx prepare`'s output (RUN/prepared, written by data/prepare.py): its manifest,
its splits as memory-mapped `datasets`, a split's named sets, and the SentencePiece model.

What training, validation, `mtx evaluate --split` and the benchmarks read, without importing
the preparation pipeline. A missing or incomplete RUN/prepared is refused in one line that
says to run `mtx prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import numpy as np

from mtx.checkpoint import Manifest, RunDir
from mtx.config import Config
from mtx.errors import MtxError


def _missing(cfg: Config) -> MtxError:
    return MtxError(
        f"no prepared data in {RunDir.of(cfg).prepared}: run `mtx prepare` with this config first"
    )


def load_manifest(cfg: Config) -> Manifest:
    path = RunDir.of(cfg).data.manifest
    if not path.is_file():
        raise _missing(cfg)
    return Manifest.read(path)


def load_prepared(cfg: Config, split: str) -> datasets.Dataset:
    data = RunDir.of(cfg).data
    if not data.manifest.is_file() or not data.split(split).is_dir():
        raise _missing(cfg)
    return datasets.load_from_disk(str(data.split(split)))


@dataclass(frozen=True)
class PreparedSet:
    """A named set of a prepared split (a direction's validation or test set): its name,
    target language (None: the model's one) and pairs."""

    name: str
    tgt_lang: str | None
    ds: datasets.Dataset


def load_sets(cfg: Config, split: str) -> list[PreparedSet]:
    """The named sets of a prepared split (its rows numbered by the `group` column), in the
    order the manifest lists them."""
    manifest = load_manifest(cfg)
    if split not in manifest.splits:
        raise MtxError(f"the prepared data has no {split} split (data.corpora names no {split})")
    ds = load_prepared(cfg, split)
    sets = manifest.splits[split].sets
    if not sets:  # prepared by an mtx without named sets: one set
        return [PreparedSet(split, manifest.tgt_lang or None, ds)]
    if len(sets) == 1:
        return [PreparedSet(sets[0].name, sets[0].tgt_lang, ds)]
    group = np.asarray(ds["group"])
    return [
        PreparedSet(s.name, s.tgt_lang, ds.select(np.flatnonzero(group == k)))
        for k, s in enumerate(sets)
    ]


def load_spm_proto(cfg: Config) -> bytes:
    path = RunDir.of(cfg).data.spm_model
    if not path.is_file():
        raise MtxError(
            f"no SentencePiece model at {path}: run `mtx prepare` with this config first"
        )
    return path.read_bytes()
