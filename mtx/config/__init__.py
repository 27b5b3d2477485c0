"""Typed configuration: a tree of dataclasses, loaded from YAML, overridden by `--set key=value`.

Each field declares everything about itself in one place (`setting`): its type (`Literal` for
a choice of words), its default, a one-line description and, for a number, its range. One
generic function (`check_fields`) checks every field against its declaration and writes the
one-line error; only the rules that tie several fields together are written by hand (each
section's `check`, and `Config.validate` for those that span sections). The CLI's help and
docs/config.md (`markdown`) are generated from the same declarations.

An unknown key is an error naming the closest valid key.

The package: `fields.py` (how a setting is declared and checked), one module per section
(`data.py`, `model.py`, `train.py`, `decode.py`: decode and serve), `tree.py` (the whole
`Config` and the rules across sections), `keys.py` (the engine: keys, YAML, --set) and
`doc.py` (help and docs/config.md). What the rest of mtx uses is imported from here.
"""

from mtx.config.data import CleanConfig, CorpusConfig, DataConfig
from mtx.config.decode import DecodeConfig, ServeConfig
from mtx.config.doc import describe, markdown
from mtx.config.fields import Range, setting
from mtx.config.keys import all_keys, apply_overrides, declared, from_dict, load_config, set_key
from mtx.config.model import ATTENTION_SCORES, PARTS, ModelConfig
from mtx.config.train import TrainConfig
from mtx.config.tree import SECTIONS, Config

__all__ = [
    "ATTENTION_SCORES",
    "PARTS",
    "SECTIONS",
    "CleanConfig",
    "Config",
    "CorpusConfig",
    "DataConfig",
    "DecodeConfig",
    "ModelConfig",
    "Range",
    "ServeConfig",
    "TrainConfig",
    "all_keys",
    "apply_overrides",
    "declared",
    "describe",
    "from_dict",
    "load_config",
    "markdown",
    "set_key",
    "setting",
]
