"""The declarations as help and documentation: one line per key (`describe`) and
docs/config.md (`markdown`)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import yaml

from mtx.config.data import CorpusConfig
from mtx.config.fields import literal_words, words
from mtx.config.keys import RENAMED, declared
from mtx.config.tree import Config

# --- the declarations as help and documentation -------------------------------------------


def describe(key: str) -> str:
    """One line for a key: its description, and its choices or range."""
    for k, tp, f in declared():
        if k == key:
            allowed = _allowed(tp, f)
            return f.metadata["doc"] + (f" ({allowed})" if allowed else "")
    raise KeyError(key)


def _allowed(tp: Any, f: dataclasses.Field) -> str:
    """What a field accepts, in words: its choices or its range ("" for any string)."""
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
    choices = literal_words(tp) or (literal_words(item) if item is not None else None)
    if choices:
        return words(choices) if item is None else "any of " + ", ".join(choices)
    valid = f.metadata.get("range")
    return valid.describe(tp is int) if valid else ""


def _type_word(tp: Any) -> str:
    if literal_words(tp) is not None:
        return "choice"
    if typing.get_origin(tp) is list:
        item = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item):
            return "list of mappings"
        return "list of choices" if literal_words(item) else "list"
    return getattr(tp, "__name__", str(tp))


def _yaml(value: Any) -> str:
    """A default as YAML writes it (`true`, `[]`, `1.0e-09`)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def markdown() -> str:
    """docs/config.md: how configs work, then every key: its type, default, choices or range,
    and description."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from mtx/config/ by `make config-doc`; a test fails when it is stale. -->",
        "",
        "A config is a YAML file of the sections below; a key left out keeps its default.",
        "Every key can also be set on the command line, `--set key=value` (repeatable), after",
        "the file; a value is read as YAML (`--set train.freeze=[encoder]`). An unknown key",
        "(with the closest valid one), a value of the wrong type, a word that is not one of a",
        "key's choices or a number outside its range is refused in one line naming the key.",
        "A checkpoint embeds its resolved config, so `translate`, `evaluate` and `serve` take",
        "`--set` over it (`--set decode.beam=8`).",
        "",
        "```yaml",
        "run_dir: runs/multi30k",
        "data: {train: data/multi30k/train, valid: data/multi30k/val,",
        "       test: data/multi30k/test2016, vocab_size: 8000}",
        "model: {d_model: 256, d_ff: 1024, n_heads: 4, encoder_layers: 3, decoder_layers: 3}",
        "train: {max_tokens: 4096, warmup_steps: 4000, lr_scale: 2.0}",
        "```",
        "",
        "The shipped configs: `configs/toy.yaml` (the demo: the toy corpus, a small model, 800",
        "updates at most), `configs/multi30k.yaml` (Multi30k en-de), `configs/base.yaml` and",
        "`configs/big.yaml` (the paper's base and big models on WMT14 en-de from the hub).",
    ]
    section = None
    for key, tp, f in declared():
        head = key.split(".")[0] if "." in key else ""
        if head != section:
            section = head
            lines += ["", f"## `{head}`" if head else "## Top level", ""]
            doc = type(getattr(Config(), head)).__doc__ if head else None
            lines += [" ".join(doc.split()), ""] if doc else []
            lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f.metadata["doc"].replace("|", "\\|")
        lines.append(
            f"| `{key}` | {_type_word(tp)} | `{_yaml(default)}` | {_allowed(tp, f)} | {text} |"
        )
        if key == "data.corpora":
            lines += _entry_rows("data.corpora[i].", CorpusConfig)
    lines += ["", "## Renamed keys", "", "Still read under their old names, with a notice:", ""]
    lines += [f"- `{old}`: now `{new}`" for old, new in RENAMED.items()]
    return "\n".join(lines) + "\n"


def _entry_rows(prefix: str, cls: type) -> list[str]:
    """The table rows of a list entry's keys (data.corpora[i].train, ...)."""
    rows = []
    for key, tp, f in declared(cls, prefix):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f.metadata["doc"].replace("|", "\\|")
        rows.append(
            f"| `{key}` | {_type_word(tp)} | `{_yaml(default)}` | {_allowed(tp, f)} | {text} |"
        )
    return rows
