"""The whole config: the run directory and one section per part of mtx, and the rules that
tie sections together."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mtx import corpora
from mtx.config.data import DataConfig
from mtx.config.decode import DecodeConfig, ServeConfig
from mtx.config.fields import check_fields, setting
from mtx.config.model import ModelConfig
from mtx.config.train import TrainConfig
from mtx.errors import MtxError
from mtx.tokens import bucket_length


@dataclass
class Config:
    """The whole config: the run directory and one section per part of mtx."""

    run_dir: str = setting("runs/default", "prepared data, checkpoints and metrics go here")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    # Not a setting: the keys the user wrote, in the file or with --set (None: every key).
    # train.init_from takes the model.* keys left out from its checkpoint (train/init.py).
    given: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def validate(self) -> Config:
        """Reject impossible settings with a message naming the key: every field against its
        declaration, each section's own rules, then those that tie sections together."""
        for section in SECTIONS:
            settings = getattr(self, section)
            check_fields(settings, f"{section}.")
            if hasattr(settings, "check"):
                settings.check()
        m, t, d = self.model, self.train, self.data
        if t.best_valid:
            names = [v.name for v in corpora.valid_sets(d)]
            if t.best_valid not in names:
                raise MtxError(
                    f"train.best_valid {t.best_valid!r} is not a validation set; they are "
                    f"{', '.join(names)}"
                )
        if d.bpe_dropout and t.static_shapes:
            raise MtxError(
                "data.bpe_dropout makes lengths change every epoch; train.static_shapes needs "
                "the prepared lengths: use one or the other"
            )
        if t.align_weight:
            self.check_guidance()
        # given, and not at its default (a config that mtx wrote out holds every key)
        single = ("src_lang", "tgt_lang", "train", "valid", "test")
        mixed = [
            f"data.{k}"
            for k in single
            if f"data.{k}" in (self.given or ()) and getattr(d, k) != getattr(DataConfig(), k)
        ]
        if d.corpora and mixed:
            raise MtxError(
                f"{mixed[0]} is given with data.corpora, which replaces it: name each "
                "corpus's languages and splits in its data.corpora entry"
            )
        if t.max_tokens < d.max_len + 1:
            raise MtxError(
                f"train.max_tokens ({t.max_tokens}) must hold one pair of data.max_len "
                f"({d.max_len}) tokens plus EOS"
            )
        longest = bucket_length(d.max_len + 1, t.pad_to)
        if longest > m.max_positions:
            raise MtxError(
                f"data.max_len ({d.max_len}) plus EOS, padded to {longest} tokens by "
                f"train.pad_to ({t.pad_to}), must fit model.max_positions ({m.max_positions})"
            )
        return self

    def check_guidance(self) -> None:
        """train.align_* against the model and the data: guided alignment (train/step.py)."""
        m, t, d = self.model, self.train, self.data
        if d.bpe_dropout:
            raise MtxError(
                "train.align_weight aligns the prepared segmentation; data.bpe_dropout samples "
                "others: use one or the other"
            )
        if m.arch != "transformer" or t.compile == "true":
            raise MtxError(
                "train.align_weight guides a Transformer's attention, trained eager: it takes "
                "model.arch transformer and no train.compile true"
            )
        if t.align_context == "full" and m.decoder_self != "attention":
            raise MtxError(
                f"train.align_context full needs the decoder's own attention; model.decoder_self "
                f"{m.decoder_self} is recurrent: set train.align_context causal"
            )
        if t.align_heads > m.n_heads:
            raise MtxError(
                f"train.align_heads ({t.align_heads}) is more than model.n_heads ({m.n_heads})"
            )
        if not -m.decoder_layers <= t.align_layer < m.decoder_layers:
            raise MtxError(
                f"train.align_layer ({t.align_layer}) is not a decoder layer: the model has "
                f"{m.decoder_layers} (0 to {m.decoder_layers - 1}, or -1 to -{m.decoder_layers})"
            )

    def with_decode(self, **changes: Any) -> Config:
        """This config with typed decode.* settings (a command's options), checked as a file's
        or --set's are."""
        if not changes:
            return self
        decode = dataclasses.replace(self.decode, **changes)
        return dataclasses.replace(self, decode=decode).validate()

    def to_dict(self) -> dict[str, Any]:
        """Every setting, as nested plain values (what config.yaml and checkpoints hold)."""
        return {
            f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if _is_key(f)
        }


SECTIONS = ("data", "model", "train", "decode", "serve")


def _is_key(f: dataclasses.Field) -> bool:
    """Whether a dataclass field is a config key or section (not bookkeeping like `given`)."""
    return "doc" in f.metadata or "section" in f.metadata or f.name in SECTIONS


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
