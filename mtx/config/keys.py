"""The settings engine: keys (renamed, unknown), YAML files and `--set key=value`, applied to
a `Config` and checked."""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from mtx.config.data import CorpusConfig
from mtx.config.fields import literal_words
from mtx.config.tree import Config, _is_key
from mtx.errors import MtxError


def type_name(tp: Any) -> str:
    return "str" if literal_words(tp) is not None else getattr(tp, "__name__", str(tp))


def coerce(key: str, value: Any, tp: Any, raw: str | None) -> Any:
    """Check `value` against the field type `tp`; `raw` is the --set text, if any."""
    if literal_words(tp) is not None:
        tp = str  # the choice itself is checked with the ranges (check_fields)
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
    if dataclasses.is_dataclass(item):  # a list of mappings, each checked as a section
        if not isinstance(value, list):
            raise MtxError(f"config key {key} must be a list of mappings, got {value!r}")
        items = []
        for i, entry in enumerate(value):
            if not isinstance(entry, dict):
                raise MtxError(f"config key {key}[{i}] must be a mapping, got {entry!r}")
            items.append(item())
            _apply(items[-1], entry, f"{key}[{i}].")
        return items
    if typing.get_origin(tp) is list:  # a YAML list, or "a,b" on the command line
        if isinstance(value, str):
            value = [x.strip() for x in value.split(",") if x.strip()]
        if typing.get_args(tp) == (int,) and _integer(value) is not None:
            return [value]  # `--set key=3`: YAML reads a number
        if typing.get_args(tp) == (int,) and isinstance(value, list):
            numbers = [_integer(x) for x in value]
            if None not in numbers:
                return numbers
        elif isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # `compile: true` in YAML, for a key that takes a word
            return str(value).lower()
        if raw is not None:  # `--set run_dir=123` means the string "123"
            return raw
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-9 as a string
            try:
                return float(value)
            except ValueError:
                pass
    raise MtxError(f"config key {key} expects {type_name(tp)}, got {value!r}")


def _integer(value) -> int | None:
    """An int, or a string that spells one ("3", "-2"); None otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


# --- keys, YAML and --set -----------------------------------------------------------------

# Keys renamed, old -> new (within one section): a config file or --set may still use the old
# name, with a one-line notice; a checkpoint's saved config is read silently.
RENAMED = {
    "data.sampling": "data.bpe_dropout",  # decode.sampling is the search's
    "data.temperature": "data.corpus_temperature",  # decode.temperature is the search's
}

Notice = typing.Callable[[str], None]


def _current(key: str, notice: Notice | None) -> str:
    """The key's current name; a renamed key is noticed, when `notice` is given."""
    new = RENAMED.get(key)
    if new is None:
        return key
    if notice is not None:
        notice(f"mtx: config key {key} is now {new}; the old name will be removed")
    return new


def _unknown(key: str) -> MtxError:
    if "[" in key:  # a key inside a list entry: data.corpora[0].trian
        head, _, name = key.rpartition(".")
        keys = [f"{head}.{k}" for k, _, _ in declared(CorpusConfig)]
        close = difflib.get_close_matches(key, keys, n=1)
        return MtxError(
            f"unknown config key {key}" + (f" (did you mean {close[0]}?)" if close else "")
        )
    close = difflib.get_close_matches(key, all_keys(), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return MtxError(f"unknown config key {key}{hint}")


def declared(cls: type = Config, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """(dotted key, type, field) of every setting of the config tree, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from declared(tp, f"{prefix}{f.name}.")
        elif _is_key(f):
            yield prefix + f.name, tp, f


def all_keys() -> list[str]:
    """Every dotted key of the config tree, e.g. `model.d_model`."""
    return [key for key, _, _ in declared()]


def _apply(
    obj: Any, values: dict[str, Any], prefix: str = "", notice: Notice | None = None
) -> None:
    hints = typing.get_type_hints(type(obj))
    fields = {f.name: f for f in dataclasses.fields(obj) if _is_key(f)}
    for name, value in values.items():
        key = _current(f"{prefix}{name}", notice)
        name = key.removeprefix(prefix)
        if name not in fields:
            raise _unknown(key)
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise MtxError(f"config key {key} must be a mapping, got {value!r}")
            _apply(getattr(obj, name), value, key + ".", notice)
        else:
            setattr(obj, name, coerce(key, value, tp, None))


def set_key(cfg: Config, key: str, raw: str, notice: Notice | None = None) -> None:
    """Apply one `--set key=value` override (value parsed as YAML, checked against the field)."""
    key = _current(key, notice)
    types = {k: tp for k, tp, _ in declared()}
    if key not in types:
        raise _unknown(key)
    *path, name = key.split(".")
    obj: Any = cfg
    for part in path:
        obj = getattr(obj, part)
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError as e:
        if raw.lstrip().startswith(("[", "{")):  # meant as YAML: say why it is not
            first = str(e).strip().splitlines()[0]
            raise MtxError(
                f"--set {key}: {raw!r} is not a YAML list ({first}; in YAML, a backslash is "
                "literal in 'single quotes', an escape in \"double quotes\")"
            ) from None
        value = raw
    setattr(obj, name, coerce(key, value, types[key], raw))


def from_dict(values: dict[str, Any], notice: Notice | None = None) -> Config:
    cfg = Config()
    _apply(cfg, values, notice=notice)
    return cfg


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, notice: Notice = _stderr
) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply overrides, validate; a
    renamed key still works, and `notice` says so in one line."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise MtxError(f"config file not found: {p}")
        try:
            values = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise MtxError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(values, dict):
            raise MtxError(f"{p}: the top level must be a mapping of config keys")
    try:
        cfg = from_dict(values, notice)
    except MtxError as e:
        raise MtxError(f"{p}: {e}") from None
    apply_overrides(cfg, overrides, notice)
    given = [*_dotted(values), *(o.split("=", 1)[0].strip() for o in overrides or [])]
    cfg.given = frozenset(RENAMED.get(key, key) for key in given)
    return cfg.validate()


def _dotted(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in values.items():
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{name}.")
        else:
            yield prefix + name


def apply_overrides(
    cfg: Config, overrides: list[str] | None, notice: Notice | None = _stderr
) -> Config:
    for item in overrides or []:
        if "=" not in item:
            raise MtxError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        set_key(cfg, key.strip(), raw, notice)
    return cfg
