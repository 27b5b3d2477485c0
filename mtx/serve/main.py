"""`mtx serve`'s start: check the extra is installed, load the engine, listen, run."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from mtx import __version__
from mtx.errors import MtxError

NEEDS = ("fastapi", "uvicorn", "prometheus_client")


def serve(
    checkpoints: list[Path],
    overrides: list[str],
    engine_name: str = "mtx",
    device: str = "auto",
    ct2_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> None:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise MtxError(f"mtx serve needs {', '.join(missing)}: pip install 'mtx[serve]'")
    from mtx.info import describe
    from mtx.serve.app import listen, run_server
    from mtx.serve.engine import make_engine

    engine = make_engine(engine_name, checkpoints, overrides, device, ct2_dir)
    s = engine.cfg.serve
    info = {
        "mtx_version": __version__,
        "engine": engine.name,
        "attention": engine.single_model,
        "checkpoints": [describe(str(path), overrides) for path in checkpoints],
        "decode": vars(engine.cfg.decode),
        "serve": vars(s),
    }
    sock = listen(s.host, s.port)
    host, port = sock.getsockname()[:2]
    where = f"[{host}]" if ":" in host else host
    log(
        f"mtx serve: listening on http://{where}:{port} ({engine.name} engine, "
        f"{len(checkpoints)} checkpoint(s), beam {engine.cfg.decode.beam}); "
        "SIGTERM or Ctrl-C to stop"
    )
    run_server(engine, info, sock)
    log("mtx serve: stopped")
