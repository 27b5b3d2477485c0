"""`mtx fetch` (mtx/data/fetch.py) against a real HTTP server on 127.0.0.1 serving the
upstream layout (gzipped files) made from the local copy of Multi30k: the files arrive
byte for byte, are checked, kept when already there, and a bad or absent source fails in one
line with nothing written."""

import functools
import gzip
import http.server
import shutil
import threading

import pytest
from conftest import ROOT
from helpers.common import invoke

from mtx.data.fetch import CORPORA, fetch
from mtx.errors import MtxError

LOCAL = ROOT.parent / "shared" / "data" / "multi30k"  # the upstream files, gunzipped


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The upstream folder of Multi30k's files, served over HTTP on 127.0.0.1."""
    folder = tmp_path_factory.mktemp("upstream")
    for local, (remote, _) in CORPORA["multi30k"].files.items():
        (folder / remote).write_bytes(gzip.compress((LOCAL / local).read_bytes()))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_writes_every_file_byte_for_byte_and_keeps_what_is_there(mirror, tmp_path):
    _, url = mirror
    logged = []
    paths = fetch("multi30k", tmp_path / "m30k", url, log=logged.append)
    assert sorted(p.name for p in paths) == sorted(CORPORA["multi30k"].files)
    for path in paths:
        assert path.read_bytes() == (LOCAL / path.name).read_bytes()
    assert "fetched" in logged[0] and "(29,000 lines)" in logged[0]
    logged.clear()
    fetch("multi30k", tmp_path / "m30k", url, log=logged.append)  # all there: nothing fetched
    assert logged == []
    (tmp_path / "m30k" / "val.de").write_text("changed\n")
    fetch("multi30k", tmp_path / "m30k", url, log=logged.append)
    assert [line.split()[1] for line in logged] == [str(tmp_path / "m30k" / "val.de")]
    assert (tmp_path / "m30k" / "val.de").read_bytes() == (LOCAL / "val.de").read_bytes()


def test_a_corrupt_file_is_refused_with_nothing_written(mirror, tmp_path):
    folder, _ = mirror
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / "train.en.gz").write_bytes(gzip.compress(b"not multi30k\n"))
    with pytest.raises(MtxError, match="train.en.gz does not have the expected SHA-256"):
        fetch("multi30k", tmp_path / "out", bad.as_uri(), log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_without_the_network_the_command_stops_at_once_in_one_line(tmp_path):
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens
    result = invoke("fetch", "multi30k", "--output", str(tmp_path / "m"), "--base", closed)
    assert result.exit_code == 2
    message = result.output.strip()
    assert "\n" not in message and "cannot download http://127.0.0.1:9/train.en.gz" in message
    assert "gunzip them and put them in" in message
    assert not (tmp_path / "m").exists()
    result = invoke("fetch", "wmt99")
    assert result.exit_code == 2 and "no corpus 'wmt99' (known: multi30k)" in result.output
