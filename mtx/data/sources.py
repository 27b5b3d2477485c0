"""Where parallel text comes from: local files, the Hugging Face hub, or the toy corpus.

A split is named by a spec string:
- `PREFIX`                    local UTF-8 files PREFIX.{src_lang} and PREFIX.{tgt_lang}, line-aligned
- `hf:NAME[:CONFIG[:SPLIT]]`  a hub dataset through `datasets.load_dataset`, e.g. `hf:wmt/wmt14:de-en`
- `toy:SPLIT`                 the embedded synthetic corpus (mtx/data/toy.py), en-de or de-en

Every loader returns a `datasets.Dataset` with string columns `src` and `tgt`, stored as Arrow
on disk, so corpora larger than memory stream through. Local files are read in binary and
split on "\n" only, so a stray U+2028 or "\r" inside a line never breaks the line alignment.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import datasets
from datasets.arrow_writer import ArrowWriter

from mtx.data import toy
from mtx.errors import MtxError

FEATURES = datasets.Features({"src": datasets.Value("string"), "tgt": datasets.Value("string")})


def describe(spec: str, src_lang: str, tgt_lang: str) -> str:
    if spec.startswith(("hf:", "toy:")):
        return spec
    return f"{spec}.{src_lang} / {spec}.{tgt_lang}"


def local_files(prefix: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    src, tgt = Path(f"{prefix}.{src_lang}"), Path(f"{prefix}.{tgt_lang}")
    for path in (src, tgt):
        if not path.is_file():
            raise MtxError(f"file not found: {path} ({_missing_advice(path, src_lang, tgt_lang)})")
    return src, tgt


def _missing_advice(path: Path, src_lang: str, tgt_lang: str) -> str:
    """What to do about a missing local split: `mtx fetch` where it is a file that a corpus
    mtx fetches puts there (data/fetch.py), else what a local split is."""
    from mtx.data.fetch import CORPORA

    corpus = CORPORA.get(path.parent.name)
    if corpus is not None and path.name in corpus.files:
        name = path.parent.name
        return f"`mtx fetch {name} --output {path.parent}` downloads it"
    return f"a local split is a prefix P of P.{src_lang}, P.{tgt_lang}"


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 file without their line ending ("\n" or "\r\n")."""
    for block in line_blocks(path):
        yield from block


def line_blocks(path: Path, size: int = 1 << 16) -> Iterator[list[str]]:
    """The lines of `path` as `read_lines` gives them, `size` lines at a time: each block is
    read and decoded at once (a line ends at b"\n", which no other UTF-8 character holds, so
    decoding the block is decoding each line; a failure is found line by line)."""
    with open(path, "rb") as f:
        done = 0
        while block := list(itertools.islice(f, size)):
            yield decode_lines(path, block, done)
            done += len(block)


def lines_at(path: Path, offset: int, n: int, first: int) -> list[str]:
    """The `n` lines of `path` from byte `offset` on, as `read_lines` gives them (`first`: the
    first one's index from 0, for errors)."""
    with open(path, "rb") as f:
        f.seek(offset)
        block = list(itertools.islice(f, n))
    if len(block) < n:
        raise MtxError(f"{path}: {n} lines from line {first + 1} expected, {len(block)} read")
    return decode_lines(path, block, first)


def decode_lines(path: Path, block: list[bytes], done: int) -> list[str]:
    """Raw lines of `path` (the `done` before them) as text without their line endings."""
    joined = b"".join(block).replace(b"\r\n", b"\n")  # "\r\n" only ends a line
    ended = block[-1].endswith(b"\n")
    if not ended and joined.endswith(b"\r"):  # the file's last line, unterminated
        joined = joined[:-1]
    try:
        text = joined.decode("utf-8")
    except UnicodeDecodeError:
        _raise_bad_line(path, block, done)
    lines = text.split("\n")
    if ended:
        lines.pop()  # the empty string after the block's last "\n"
    return lines


def _raise_bad_line(path: Path, block: list[bytes], done: int) -> NoReturn:
    for number, raw in enumerate(block, start=done + 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MtxError(
                f"{path}:{number}: invalid UTF-8 ({e.reason} at byte {e.start})"
            ) from None
    raise AssertionError("a block that failed to decode has a line that fails")


def file_hashes(spec: str, src_lang: str, tgt_lang: str) -> dict[str, str]:
    """sha256 of a local split's two files (empty for hub and toy splits)."""
    if spec.startswith(("hf:", "toy:")):
        return {}
    return {str(path): sha256_file(path) for path in local_files(spec, src_lang, tgt_lang)}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def count_lines(path: Path) -> int:
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _read_local(src: Path, tgt: Path, cache_dir: str | os.PathLike) -> datasets.Dataset:
    """Two line-aligned files as a Dataset, written to an Arrow file of its own in cache_dir
    a block of lines at a time (a row at a time through from_generator was several times
    slower)."""
    os.makedirs(cache_dir, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="read-", suffix=".arrow", dir=cache_dir)
    os.close(fd)
    with ArrowWriter(features=FEATURES, path=path) as writer:
        for s, t in zip(line_blocks(src), line_blocks(tgt), strict=True):
            writer.write_batch({"src": s, "tgt": t})
        writer.finalize()
    return datasets.Dataset.from_file(path)


def _toy_pairs(split: str, swap: bool) -> Iterator[dict[str, str]]:
    for s, t in toy.split_pairs(split):
        yield {"src": t, "tgt": s} if swap else {"src": s, "tgt": t}


def parse_hub_spec(spec: str, default_split: str) -> tuple[str, str | None, str]:
    """`hf:NAME[:CONFIG[:SPLIT]]` -> (name, config, split)."""
    parts = spec[len("hf:") :].split(":")
    if not parts[0] or len(parts) > 3:
        raise MtxError(f"hub dataset spec must be hf:NAME[:CONFIG[:SPLIT]], got {spec!r}")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else default_split
    return name, config, split


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (None: it can, or HF_HUB_OFFLINE /
    HF_DATASETS_OFFLINE say to use the local cache): one connection, no retries."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return None
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError as e:
        return f"cannot reach {url.scheme}://{url.netloc} ({e.strerror or e})"
    return None


def load_hub(spec: str, src_lang: str, tgt_lang: str, default_split: str) -> datasets.Dataset:
    name, config, split = parse_hub_spec(spec, default_split)
    why = hub_unreachable()
    if why:  # at once: datasets would retry for half a minute before failing
        raise MtxError(
            f"hub dataset {spec!r}: {why}; it needs the network (or HF_DATASETS_OFFLINE=1 to "
            "use a copy in the local cache); without it, point data.train / data.valid / "
            "data.test at local files (a prefix P of P.SRC and P.TGT)"
        )
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except (ConnectionError, OSError, TimeoutError) as e:
        raise MtxError(
            f"could not load hub dataset {spec!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}. "
            "This is a network or hub problem; without network access, point data.train / "
            "data.valid / data.test at local files (a prefix P of P.SRC and P.TGT)"
        ) from None
    except Exception as e:  # datasets raises many types for a wrong name, config or split
        raise MtxError(f"could not load hub dataset {spec!r}: {str(e).splitlines()[0]}") from None
    return hub_to_pairs(ds, spec, src_lang, tgt_lang)


def hub_to_pairs(ds: datasets.Dataset, spec: str, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    """Map a hub dataset's `translation` dict column (or per-language columns) to src/tgt."""
    columns = ds.column_names
    if "translation" in columns:

        def pick(batch):
            rows = batch["translation"]
            try:
                return {"src": [r[src_lang] for r in rows], "tgt": [r[tgt_lang] for r in rows]}
            except KeyError as e:
                raise MtxError(
                    f"hub dataset {spec!r} has no language {e.args[0]!r} in its translation column"
                ) from None

    elif src_lang in columns and tgt_lang in columns:

        def pick(batch):
            return {"src": batch[src_lang], "tgt": batch[tgt_lang]}

    else:
        raise MtxError(
            f"hub dataset {spec!r} has columns {columns}; expected 'translation' or "
            f"'{src_lang}' and '{tgt_lang}'"
        )
    return ds.map(
        pick,
        batched=True,
        remove_columns=columns,
        features=FEATURES,
        new_fingerprint=f"mtx-pairs-{src_lang}-{tgt_lang}-{ds._fingerprint}",
    )


def load_split(
    spec: str, src_lang: str, tgt_lang: str, default_split: str, cache_dir: str | os.PathLike
) -> datasets.Dataset:
    """The split named by `spec` as a Dataset of src/tgt strings (Arrow files in `cache_dir`)."""
    if spec.startswith("hf:"):
        return load_hub(spec, src_lang, tgt_lang, default_split)
    if spec.startswith("toy:"):
        split = spec[len("toy:") :]
        if split not in toy.SPLITS:
            raise MtxError(f"toy corpus split must be one of {', '.join(toy.SPLITS)}, got {spec!r}")
        if {src_lang, tgt_lang} != {"en", "de"}:
            raise MtxError(
                f"the toy corpus ({spec}) is en-de, either way round; got {src_lang}-{tgt_lang}"
            )
        gen, kwargs = _toy_pairs, {"split": split, "swap": src_lang == "de"}
    else:
        src, tgt = local_files(spec, src_lang, tgt_lang)
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            raise MtxError(
                f"{src} has {n_src} lines but {tgt} has {n_tgt}; they must be line-aligned"
            )
        if n_src == 0:
            raise MtxError(f"{src} and {tgt} are empty")
        return _read_local(src, tgt, cache_dir)
    try:
        return datasets.Dataset.from_generator(
            gen, gen_kwargs=kwargs, features=FEATURES, cache_dir=str(cache_dir)
        )
    except datasets.exceptions.DatasetGenerationError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, MtxError):
            raise cause from None
        raise
