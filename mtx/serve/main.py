"""`mtx serve`'s start: check the extra is installed, load the engine, listen, run."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
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
    from mtx.device import pick_device
    from mtx.info import describe
    from mtx.serve.app import listen, run_server
    from mtx.serve.engine import Front, make_engine
    from mtx.serve.workers import Spec, start_workers

    front = Front(checkpoints, overrides)  # the settings, without the model's weights
    workers = worker_count(front.cfg.serve.workers, pick_device(device, "--device").type)
    if workers > 1 and engine_name == "mtx":  # the decoding processes hold the model
        engine = front
    else:  # CTranslate2's export is made here, once, before its decoding processes start
        engine = make_engine(engine_name, checkpoints, overrides, device, ct2_dir)
    s = engine.cfg.serve
    info = {
        "mtx_version": __version__,
        "engine": engine.name,
        "attention": engine.single_model,
        "workers": workers,
        "checkpoints": [describe(str(path), overrides) for path in checkpoints],
        "decode": vars(engine.cfg.decode),
        "serve": vars(s),
    }
    sock = listen(s.host, s.port)
    decoders = []
    try:
        if workers > 1:  # decoding processes; else this one decodes
            threads = max(1, cores() // workers)
            decoders = start_workers(
                Spec(engine_name, checkpoints, overrides, device, ct2_dir, threads), workers
            )
        host, port = sock.getsockname()[:2]
        where = f"[{host}]" if ":" in host else host
        log(
            f"mtx serve: listening on http://{where}:{port} ({engine.name} engine, "
            f"{len(checkpoints)} checkpoint(s), beam {engine.cfg.decode.beam}, "
            f"{workers} decoding {'processes' if decoders else 'worker'}); "
            "SIGTERM or Ctrl-C to stop"
        )
        run_server(engine, info, sock, [d.translate for d in decoders])
    finally:
        for decoder in decoders:
            decoder.stop()
        sock.close()
    log("mtx serve: stopped")


def worker_count(setting: int, device: str) -> int:
    """serve.workers: as set, or with 0 one per CPU core (at most MAX_AUTO_WORKERS) on the CPU
    and 1 on a GPU."""
    if setting:
        return setting
    return min(cores(), MAX_AUTO_WORKERS) if device == "cpu" else 1
