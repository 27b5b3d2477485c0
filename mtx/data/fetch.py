"""Public corpora that mtx fetches itself (`mtx fetch NAME`), so that a recipe runs anywhere
with the repository and the internet.

    mtx fetch multi30k --output data/multi30k

Multi30k (Elliott et al. 2016; task 1, English-German image captions): the raw files of the
multi30k/dataset repository on GitHub, at a fixed commit, gunzipped into
OUTPUT/{train,val,test2016,test2017}.{en,de}: 29,000 training pairs, 1,014 validation, 1,000
in each test set, byte for byte what sacreBLEU's multi30k test sets hold. Each file's SHA-256
is checked after download; a file already there with the right checksum is not fetched
again, and a file is written beside its name and renamed when whole, so an interrupted fetch
leaves nothing half-written. Without the network, the command stops at once in one line that
says what to download and where to put it.

The data are for non-commercial research and education (the repository's README: Multi30K is
partly derived from Flickr30K).
"""

from __future__ import annotations

import gzip
import hashlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mtx.errors import MtxError
from mtx.files import atomic_write

TIMEOUT_S = 30  # a connection that does not answer in this long fails (once: no retries)


@dataclass(frozen=True)
class Corpus:
    """A corpus's files: each local name -> (its path under `base`, gzipped; its SHA-256)."""

    base: str  # the address the paths are under
    files: dict[str, tuple[str, str]]
    about: str  # one line: what it is


MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
CORPORA = {
    "multi30k": Corpus(
        base=f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/data/task1/raw",
        files={
            "train.en": ("train.en.gz", "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"),
            "train.de": ("train.de.gz", "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"),
            "val.en": ("val.en.gz", "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"),
            "val.de": ("val.de.gz", "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"),
            "test2016.en": ("test_2016_flickr.en.gz", "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182"),
            "test2016.de": ("test_2016_flickr.de.gz", "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16"),
            "test2017.en": ("test_2017_flickr.en.gz", "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98"),
            "test2017.de": ("test_2017_flickr.de.gz", "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081"),
        },
        about="Multi30k task 1, en-de image captions: train 29,000, val 1,014, test2016 and "
        "test2017 1,000 pairs each",
    ),
}  # fmt: skip


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _have(path: Path, sha256: str) -> bool:
    return path.is_file() and _sha256(path.read_bytes()) == sha256


def _download(url: str, name: str, output: Path) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise MtxError(
            f"mtx fetch {name}: cannot download {url} ({reason}); without the network, "
            f"download the files of {url.rsplit('/', 1)[0]}/, gunzip them and put them in "
            f"{output} as docs/data.md says"
        ) from None


def fetch(name: str, output: Path, base: str | None = None, log=print) -> list[Path]:
    """Fetch corpus `name` into the folder `output` (`base`: another address for its files,
    e.g. a mirror); returns its files. A file already there with its checksum is kept."""
    if name not in CORPORA:
        raise MtxError(f"mtx fetch: no corpus {name!r} (known: {', '.join(CORPORA)})")
    corpus = CORPORA[name]
    paths = []
    for local, (remote, sha256) in corpus.files.items():
        path = output / local
        paths.append(path)
        if _have(path, sha256):
            continue
        url = f"{(base or corpus.base).rstrip('/')}/{remote}"
        data = _download(url, name, output)
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            raise MtxError(f"mtx fetch {name}: {url} is not a gzip file") from None
        if _sha256(data) != sha256:
            raise MtxError(
                f"mtx fetch {name}: {url} does not have the expected SHA-256 ({sha256}); "
                "nothing written"
            )
        atomic_write(path, lambda f, data=data: f.write(data))
        lines = data.count(b"\n")
        log(f"fetched {path} ({lines:,} lines)")
    return paths
