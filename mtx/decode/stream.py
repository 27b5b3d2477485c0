"""Lines from an endless input (stdin, a pipe), in chunks of bounded size, with a background
reader that sends a short chunk as soon as the input pauses: what `mtx translate` reads with."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

from mtx.errors import MtxError


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def chunks(lines: Iterable[str], size: int, idle: float | None = None) -> Iterator[list[str]]:
    """Lists of `size` consecutive lines (the last one shorter).

    With `idle` (seconds), `lines` is read by a background thread and a shorter list goes out
    as soon as no line has come for `idle` seconds: a slow pipe or a person typing gets each
    answer without waiting for `size` lines. The reader runs at most `size` lines ahead, so
    memory stays bounded however long the input is.
    """
    if size < 1:
        raise MtxError(f"--chunk-lines must be at least 1, got {size}")
    chunk: list[str] = []
    if idle is None:
        for line in lines:
            chunk.append(line)
            if len(chunk) >= size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
        return
    pending: queue.Queue = queue.Queue(maxsize=size)
    end = object()

    def read() -> None:
        try:
            for line in lines:
                pending.put(line)
        except BaseException as e:  # handed to the consumer, which raises it
            pending.put(_Failed(e))
        pending.put(end)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            item = pending.get(timeout=idle) if chunk else pending.get()
        except queue.Empty:  # the input has paused: answer what has come
            yield chunk
            chunk = []
            continue
        if item is end:
            break
        if isinstance(item, _Failed):
            raise item.error
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
