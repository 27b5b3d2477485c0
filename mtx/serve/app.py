"""The HTTP side of `mtx serve`: a FastAPI app over the batcher, and the uvicorn server running it.

    POST /translate   {"text": "..." | ["...", ...], "beam": 4, "nbest": 1, "attention": false,
                       "alignments": false (each result's word links: decode/align.py),
                       "tgt_lang": "de" (needed when the model translates into several),
                       "format": "plain" | "paragraphs" | "html" | "xml" (decode/documents.py;
                       default decode.format), "draft": null (decode.draft's drafts where they
                       run: beam 1) | true | false: decode/options.py declares each};
                      a text may be an object with controls: {"text": "...", "prefix": "...",
                      "constraints": ["..."], "avoid": ["..."]} (decode/controls.py)
    GET  /health      the process is alive
    GET  /ready       the model is loaded and every worker has come for work (503 before
                      that, and while stopping)
    GET  /info        what `mtx info --json` says of each checkpoint, the engine and serve.*
    GET  /metrics     Prometheus text (metrics.py)
    GET  /            a page to try it, with the attention as a heatmap (page.html)
    GET  /openapi.json  the API's OpenAPI schema (no /docs page: Swagger UI would load its
                      scripts from a CDN, and the server fetches nothing from outside)

Every error is JSON, {"error": "one line", "status": N}: 413 for a body, a list or a text over
its limit (naming the serve.* key), 422 for malformed JSON, wrong types, unknown keys and
options out of range, 503 (with Retry-After) when the queue is full or the server is stopping,
504 when a request waited longer than serve.timeout_s. A text with no words gets "" without
being decoded.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
import typing
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from starlette.exceptions import HTTPException

from mtx.decode import documents
from mtx.decode.controls import CONTROLS, Controls, Line
from mtx.decode.options import Options
from mtx.decode.result import EMPTY
from mtx.errors import MtxError
from mtx.serve.batcher import Batcher, QueueFull, ShuttingDown
from mtx.serve.batcher import Request as Pending
from mtx.serve.front import Front, Result
from mtx.serve.metrics import Metrics

RETRY_AFTER_S = 1
RETRY = {"Retry-After": str(RETRY_AFTER_S)}  # with a 503


def source_model() -> type[BaseModel]:
    """A text with controls, as a line of `mtx translate --json` holds it: its fields made from
    the controls' declarations (decode/controls.py), checked there too."""
    fields: dict[str, Any] = {"text": (str, ...)}
    for c in CONTROLS.values():
        fields[c.name] = (c.annotation, c.default if c.kind != "phrases" else [])
    config = ConfigDict(extra="forbid", strict=True)
    return create_model("Source", __config__=config, **fields)


# the options (decode/options.py) a request may set; those it leaves out are the settings'
REQUEST_OPTIONS = ("beam", "nbest", "attention", "tgt_lang", "alignments", "format", "draft")


def request_model() -> type[BaseModel]:
    """POST /translate's body: one text, or a list translated in order, and the options of
    REQUEST_OPTIONS, each declared by decode/options.py (a word's choices checked there, in
    its words). Types are strict: "4" is not a beam."""
    hints = typing.get_type_hints(Options)
    fields: dict[str, Any] = {"text": (str | (source := source_model()) | list[str | source], ...)}
    for name in REQUEST_OPTIONS:
        tp = hints[name]
        tp = str if typing.get_origin(tp) is Literal else tp  # checked by Options, in words
        fields[name] = (tp | None, None)
    return create_model(
        "TranslateRequest", __config__=ConfigDict(extra="forbid", strict=True), **fields
    )


class TranslateResponse(BaseModel):
    results: list[dict[str, Any]]  # one per text, in order: decode/result.py's JSON form
    # deprecated, answered until mtx 0.3 (docs/serving.md): the same, as the old shape
    translations: list[str]  # one per text, in order
    scores: list[float | None]  # each translation's search score (None for a text with no words)
    nbest: list[list[dict[str, Any]]] | None = None  # with nbest > 1: [{"text", "score"}, ...]
    unmet: list[int] | None = None  # with constraints: how many each translation lacks
    alternatives: list[list[dict[str, Any]] | None] | None = None  # [{"text", "score"}, ...]
    attention: list[dict[str, Any] | None] | None = None  # with attention: result.py's Attention
    # with a format: what the parser repaired in each text ("text[i]: ..."), if anything
    repairs: list[str] | None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str, outcome: str, headers=None) -> None:
        super().__init__(message)
        self.status, self.message, self.outcome, self.headers = status, message, outcome, headers


def invalid(message: str) -> ApiError:
    return ApiError(422, message, "invalid")


def too_large(message: str) -> ApiError:
    return ApiError(413, message, "too_large")


def _error(status: int, message: str, headers=None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status, headers=headers)


def _where(loc: tuple) -> str:
    """A pydantic error's location as a user writes it: ("text", "list[str]", 1) -> text[1]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "str" and part != "Source" and "[" not in part:  # a union's branch
            out += ("." if out else "") + str(part)
    return out or "the body"


def _validation_message(e: ValidationError) -> str:
    """One line for the most specific of pydantic's errors (text[1] rather than text)."""
    errors = e.errors()
    best = max(errors, key=lambda x: len(_where(x["loc"])))
    where = _where(best["loc"])
    if where == "text" and best["type"] != "missing":
        return "text: must be a string or a list of strings"
    return f"{where}: {best['msg']}"


def _page() -> str:
    return resources.files("mtx.serve").joinpath("page.html").read_text(encoding="utf-8")


class Service:
    """The batcher, metrics and limits behind the routes. The batcher's workers decode with
    `decoders` (the decoding processes' `translate`: workers.py); `engine` (front.py) counts
    source tokens and holds the settings."""

    def __init__(self, engine: Front, info: dict, decoders: list) -> None:
        self.engine, self.info = engine, info
        self.model = request_model()  # made now: from the controls declared now
        self.cfg = engine.cfg
        s = self.cfg.serve
        self.metrics = Metrics()
        self.batcher = Batcher(
            decoders,
            batch_tokens=self.cfg.decode.batch_tokens,
            max_wait_s=s.max_wait_ms / 1000,
            max_queue=s.max_queue,
            batching=s.batching,
            on_batch=lambda jobs: self.metrics.batch.observe(len(jobs)),
        )
        self.metrics.queue.set_function(self.batcher.depth)
        self.metrics.workers.set(len(self.batcher.engines))
        self.metrics.busy.set_function(self.batcher.busy_workers)
        self.drain_timer: threading.Timer | None = None
        self.drain_lock = threading.Lock()

    def begin_drain(self) -> None:
        """SIGTERM/SIGINT: take no new requests, finish the queue, and after serve.drain_s
        answer what is left with 503."""
        with self.drain_lock:  # a second signal changes nothing
            if self.drain_timer is not None:
                return
            if self.cfg.serve.drain_s == 0:  # no draining: what is queued gets 503 now
                self.batcher.stop(timeout=0)
            self.batcher.drain()
            self.drain_timer = threading.Timer(self.cfg.serve.drain_s, self.batcher.stop)
            self.drain_timer.daemon = True
            self.drain_timer.start()

    async def read_request(self, request: Request) -> BaseModel:
        s = self.cfg.serve
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > s.max_body_bytes:
                limit = s.max_body_bytes
                raise too_large(f"the request body exceeds serve.max_body_bytes ({limit})")
        try:
            value = json.loads(bytes(body))
        except UnicodeDecodeError:
            raise invalid("the request body is not valid UTF-8") from None
        except (ValueError, RecursionError) as e:
            raise invalid(f"the request body is not valid JSON ({e})") from None
        try:
            return self.model.model_validate(value)
        except ValidationError as e:
            raise invalid(_validation_message(e)) from None

    def check(self, req: BaseModel, items: list) -> Options:
        """The request's texts within serve.* limits, and its options, checked as the
        translator checks them (decode/engines.py)."""
        s = self.cfg.serve
        if not items:
            raise invalid("text: an empty list (give at least one text)")
        if len(items) > s.max_texts:
            raise too_large(f"{len(items)} texts; serve.max_texts is {s.max_texts}")
        texts = [x if isinstance(x, str) else x.text for x in items]
        for i, text in enumerate(texts):
            if len(text) > s.max_chars:
                n = len(text)
                raise too_large(f"text {i} has {n} characters; serve.max_chars is {s.max_chars}")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid(f"text {i} is not valid Unicode (a lone surrogate)") from None
        if req.beam is not None and not 1 <= req.beam <= s.max_beam:
            raise invalid(f"beam must be in 1..{s.max_beam} (serve.max_beam)")
        given = {k: getattr(req, k) for k in REQUEST_OPTIONS if getattr(req, k) is not None}
        try:
            return self.engine.options(**given)
        except MtxError as e:
            raise invalid(str(e)) from None

    def lines(self, items: list, options: Options) -> list[str | Line]:
        """Each text, or a `Line` with its controls, checked as the translator checks them."""
        out: list[str | Line] = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                out.append(item)
                continue
            where = "text" if len(items) == 1 else f"text[{i}]"
            try:
                line = Line(item.text, Controls.read(item.model_dump(), where))
                if line.controls.alternatives > self.cfg.serve.max_beam:
                    raise MtxError(f"{where}: alternatives must be at most serve.max_beam")
                self.engine.check_controls(line, options, where)
            except MtxError as e:
                raise invalid(str(e)) from None
            out.append(line)
        return out

    async def translate(self, request: Request) -> dict:
        req = await self.read_request(request)
        items = req.text if isinstance(req.text, list) else [req.text]
        options = self.check(req, items)
        texts = self.lines(items, options)
        if options.documents:
            return await self.translate_documents(texts, options)
        todo = [i for i, x in enumerate(items) if (x if isinstance(x, str) else x.text).split()]
        results: list[Result | None] = [None] * len(texts)
        if todo:
            done = await self.decode([texts[i] for i in todo], options)
            for i, result in zip(todo, done):
                results[i] = result
        return self.answer(results, texts, options)

    async def translate_documents(self, texts: list, options: Options) -> dict:
        """Each text read in its format, its sentences translated with everyone else's, and
        put back together (decode/documents.py)."""
        settings = documents.settings_of(self.cfg, options.format)
        name = (lambda i: "text") if len(texts) == 1 else (lambda i: f"text[{i}]")
        try:
            sentences = documents.read(texts, settings, 0, None, name)
        except MtxError as e:
            raise invalid(str(e)) from None
        done: list[Result] = []
        each = sentences.sentences
        if each:
            links = any(s.links for s in each)
            asked = options.sentences(alignments=links)
            done = await self.decode([s.item for s in each], asked)
        translations = documents.results(sentences, [r.translation.best for r in done])
        results: list[Result | None] = [Result(t) for t in translations]
        for sentence, result in zip(each, done):
            results[sentence.owner].tokens_in += result.tokens_in
            results[sentence.owner].ids += result.ids
        out = self.answer(results, texts, options)
        repairs = [note for notes in sentences.notes for note in notes]
        if repairs:
            out["repairs"] = repairs
        return out

    async def decode(self, texts: list[str | Line], options: Options) -> list[Result]:
        """Queue the texts and wait for their results, at most serve.timeout_s."""
        pending = Pending(asyncio.get_running_loop(), len(texts))
        lengths = [self.engine.length(t if isinstance(t, str) else t.text) for t in texts]
        timeout = self.cfg.serve.timeout_s
        try:
            self.batcher.submit(pending, texts, lengths, options)
            results = await asyncio.wait_for(asyncio.shield(pending.future), timeout)
            for result, length in zip(results, lengths):
                result.tokens_in = length
            return results
        except QueueFull as e:
            raise ApiError(503, str(e), "queue_full", RETRY) from None
        except ShuttingDown as e:
            raise ApiError(503, str(e), "unavailable", RETRY) from None
        except asyncio.TimeoutError:
            self.batcher.cancel(pending)
            raise ApiError(
                504, f"not translated within serve.timeout_s ({timeout:g} s)", "timeout"
            ) from None
        except Exception as e:
            raise ApiError(500, f"decoding failed: {type(e).__name__}: {e}", "error") from e

    def answer(
        self, results: list[Result | None], lines: list[str | Line], options: Options
    ) -> dict:
        """{"results": each text's result in decode/result.py's JSON form}, and the same in
        the deprecated shape (docs/serving.md)."""
        m = self.metrics
        done = [r.translation if r else EMPTY for r in results]
        out: dict[str, Any] = {
            "results": [t.to_json(options.nbest) for t in done],
            "translations": [t.best.text for t in done],
            "scores": [t.best.score for t in done],
        }
        if options.nbest > 1:
            out["nbest"] = [
                [{"text": o.text, "score": o.score} for o in t.outputs] if r else []
                for t, r in zip(done, results)
            ]
        if options.attention:
            out["attention"] = [r.attention if r else None for r in results]
        if any(not isinstance(x, str) and x.controls.constraints for x in lines):
            out["unmet"] = [t.best.unmet for t in done]
        if any(t.alternatives for t in done):
            out["alternatives"] = [
                [{"text": o.text, "score": o.score} for o in t.outputs] if t.alternatives else None
                for t in done
            ]
        m.tokens_in.inc(sum(r.tokens_in for r in results if r))
        m.tokens_out.inc(sum(len(r.ids) for r in results if r))
        return out


def create_app(engine: Front, info: dict, decoders: list) -> FastAPI:
    service = Service(engine, info, decoders)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield  # the batcher's workers are run by run_server
        service.batcher.stop()

    app = FastAPI(
        title="mtx serve",
        summary="Machine translation with mtx: batched, and exact",
        version=str(info.get("mtx_version", "")),
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc load their scripts from a CDN
        redoc_url=None,
    )
    app.state.service = service

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error(e.status, e.message, e.headers)

    _add_translate(app, service)
    _add_status_and_page(app, service)
    return app


def _add_translate(app: FastAPI, service: Service) -> None:
    """POST /translate, with its request body's schema on the OpenAPI page."""
    schema = service.model.model_json_schema()
    body = {"required": True, "content": {"application/json": {"schema": schema}}}

    @app.post("/translate", response_model=TranslateResponse, openapi_extra={"requestBody": body})
    async def translate(request: Request):
        """Translate one text or a list; each answer equals `mtx translate`'s for that line."""
        start = time.perf_counter()
        try:
            out = await service.translate(request)
        except ApiError as e:
            service.metrics.count(e.outcome, 0)
            raise
        service.metrics.count("ok", len(out["translations"]))
        service.metrics.latency.observe(time.perf_counter() - start)
        return out


def _add_status_and_page(app: FastAPI, service: Service) -> None:
    """GET /health, /ready, /info, /metrics and the page."""

    @app.get("/health")
    async def health() -> dict:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        """The model is loaded and every worker takes requests."""
        if service.batcher.running:
            return {"ready": True}
        return _error(503, "not ready: the workers are starting, stopping or stopped")

    @app.get("/info")
    async def about() -> dict:
        """The checkpoints (as `mtx info --json` describes them), the engine and serve.*."""
        return service.info

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> str:
        return _page()


def listen(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: one the system picks); the caller prints its address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it a kept-alive connection waited about 45 ms for each answer (Nagle's
    # algorithm against the client's delayed acknowledgement)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        from mtx.errors import MtxError

        raise MtxError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    return sock


def run_server(
    engine: Front, info: dict, sock: socket.socket, decoders: list, log_level="warning"
) -> None:
    """Serve until SIGTERM or SIGINT, then drain (serve.drain_s) and return: exit status 0.

    The batcher's workers (each waiting on its decoding process) run in this (the main) thread
    and threads of their own, uvicorn in another."""
    app = create_app(engine, info, decoders)
    service: Service = app.state.service
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=engine.cfg.serve.drain_s + 5,
        lifespan="on",
    )
    server = uvicorn.Server(config)  # in a thread, it leaves the signals to us

    def http() -> None:
        try:
            server.run(sockets=[sock])
        finally:  # however it ends, the worker ends too
            service.batcher.stop()

    def on_signal(sig: int, frame) -> None:
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True  # a second Ctrl-C
        server.should_exit = True
        # not here: the handler interrupts the worker, which may hold the batcher's lock
        threading.Thread(target=service.begin_drain, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    thread = threading.Thread(target=http, name="mtx-serve-http")
    thread.start()
    service.batcher.work()
    thread.join()
