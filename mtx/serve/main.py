"""`mtx serve`'s start: check the extra is installed, start the decoding processes, listen, run.

This process never imports torch (front.py): the first decoding process builds the engine and
describes it, and the settings it reads decide how many more to start."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from mtx import __version__
from mtx.device import cores
from mtx.errors import MtxError

NEEDS = ("fastapi", "uvicorn", "prometheus_client")
MAX_AUTO_WORKERS = 4  # each holds a copy of the model


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
    from mtx.serve.app import listen, run_server
    from mtx.serve.front import Front, check_engine
    from mtx.serve.workers import Spec, start_workers

    check_engine(engine_name)
    spec = Spec(engine_name, checkpoints, overrides, device, ct2_dir)
    # the first builds the engine (and CTranslate2's export, once) and describes it
    decoders = start_workers(spec, 1)
    sock = None
    try:
        about = decoders[0].about
        engine = Front(about)
        workers = worker_count(engine.cfg.serve.workers, about.setup.device)
        spec = replace(spec, threads=max(1, cores() // workers))  # the cores shared out
        decoders[0].set_threads(spec.threads)
        s = engine.cfg.serve
        sock = listen(s.host, s.port)
        decoders += start_workers(spec, workers - 1, first=1)
        info = {
            "mtx_version": __version__,
            "engine": engine.name,
            "attention": engine.attention,
            "workers": workers,
            "checkpoints": about.checkpoints,
            "directions": about.checkpoints[0]["directions"],
            "target_languages": engine.languages,
            "tgt_lang_required": engine.codec.languages.needs_target,
            "decode": vars(engine.cfg.decode),
            "serve": vars(s),
        }
        host, port = sock.getsockname()[:2]
        where = f"[{host}]" if ":" in host else host
        log(
            f"mtx serve: listening on http://{where}:{port} ({engine.name} engine, "
            f"{len(checkpoints)} checkpoint(s), beam {engine.cfg.decode.beam}, "
            f"{workers} decoding process{'es' if workers > 1 else ''}); "
            "SIGTERM or Ctrl-C to stop"
        )
        run_server(engine, info, sock, [d.translate for d in decoders])
    finally:
        for decoder in decoders:
            decoder.stop()
        if sock is not None:
            sock.close()
    log("mtx serve: stopped")


def worker_count(setting: int, device: str) -> int:
    """serve.workers: as set, or with 0 one per CPU core (at most MAX_AUTO_WORKERS) on the CPU
    and 1 on a GPU."""
    if setting:
        return setting
    return min(cores(), MAX_AUTO_WORKERS) if device == "cpu" else 1
