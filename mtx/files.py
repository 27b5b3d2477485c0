"""Files mtx writes are whole or absent: written to a temporary file, fsynced, then renamed.

A crash (or `kill -9`) at any moment leaves either the previous file or the new one, never a
half-written one. Nothing mtx writes is world-writable (`restrict_umask`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

TMP_SUFFIX = ".tmp"


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call `write` on a temporary binary file beside `path`, then rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files an interrupted `atomic_write` left in `directory`."""
    stale = sorted(directory.glob(f".*{TMP_SUFFIX}")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def restrict_umask() -> None:
    """Keep the user's umask but never create world-writable files or directories."""
    current = os.umask(0o022)
    os.umask(current | 0o002)


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, read a megabyte at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
