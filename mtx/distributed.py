"""The processes `torchrun` starts (one per GPU; CPU processes too), working as one job: data-
parallel training (mtx/train/) and corpus jobs spread over the processes (mtx/jobs/shards.py).

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE and runs the rendezvous, on one machine or many;
mtx joins the process group (NCCL on GPUs, gloo on CPUs) and wraps the model in torch's
DistributedDataParallel, which averages the gradients across processes during the backward
pass. Without torchrun (WORLD_SIZE unset or 1) nothing here communicates.

One source of truth: a decision that every process must take alike is taken by the main
process (rank 0) and sent to the others (`decide`), or by a collective (`sum`, `any`); no
process decides from its own disk or its own clock. Only rank 0 reads and writes the run's
files (checkpoints, metrics, config); the other processes need nothing on disk but the
prepared data, which `check_same_data` compares with rank 0's at the start.

No hangs: a collective that waits longer than `train.dist_timeout` seconds fails. Every
process beats a heartbeat counter in torchrun's store once a second (`Heartbeat`); after a
failed collective, the counters that stand still name the processes that died or hang, and
the error says so in one line. torchrun then stops the other processes and the job exits.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from mtx.errors import MtxError

T = TypeVar("T")
BEAT_S = 1.0  # heartbeat period; a failed collective watches the counters for 3 periods
STORE_TIMEOUT_S = 10.0  # the heartbeat's store calls fail after this long


class Heartbeat:
    """A thread that adds 1 to this process's counter in torchrun's store every BEAT_S seconds,
    and, after a failure, the ranks whose counters stand still (they died or hang). Counters
    are compared with themselves, never with another machine's clock."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        # A client of its own: the process group's is busy with the collectives' set-up.
        self.store = attempt_store("heartbeat", timedelta(seconds=STORE_TIMEOUT_S))
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="mtx-heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stopped.wait(BEAT_S):
            try:
                self.store.add(str(self.rank), 1)
            except Exception:  # the store went away: the job is ending
                return

    def silent(self) -> list[int] | None:
        """The other ranks whose counters did not move over 3 beats (None: no store)."""
        try:
            before = self._counts()
            time.sleep(3 * BEAT_S)
            after = self._counts()
        except Exception:
            return None
        return [r for r in range(self.world) if r != self.rank and after[r] == before[r]]

    def _counts(self) -> list[int]:
        return [self.store.add(str(r), 0) for r in range(self.world)]  # add 0: read

    def stop(self) -> None:
        """Stop beating, and wait until the thread has ended. A thread left inside a store
        call (C++, the GIL released) when the interpreter shuts down is ended in the middle of
        C++ code, which aborts the process (SIGABRT, "terminate called without an active
        exception"): a finished job would exit non-zero. The wait is bounded by the store's
        timeout, after which a call inside it fails."""
        self.stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=STORE_TIMEOUT_S + 2 * BEAT_S)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    heartbeat: Heartbeat | None = None
    backend: str | None = None  # the process group's (nccl or gloo) once joined, else None

    @property
    def main(self) -> bool:
        """The process that reads and writes the run's files, logs and progress."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """Several processes: decisions go through rank 0 and collectives."""
        return self.world > 1

    @property
    def joined(self) -> bool:
        """In torchrun's process group (with one process too): the model goes through DDP."""
        return self.backend is not None

    @classmethod
    def from_env(cls, device: torch.device, timeout_s: float, backend: str | None = None) -> Dist:
        """Join torchrun's process group if torchrun started this process (one process too,
        so that a one-GPU torchrun job runs NCCL as a larger one does); `device` picks the
        backend unless `backend` is given, and a collective that waits `timeout_s` seconds
        fails."""
        if not under_torchrun():
            return cls(device=device)
        world = int(os.environ["WORLD_SIZE"])
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        if not dist.is_initialized():
            timeout = timedelta(seconds=timeout_s)
            # torchrun's store outlives a restart, and the default keys of the process group's
            # set-up would then hold the previous attempt's addresses: keys of this attempt.
            store = attempt_store("pg", timeout)
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world, timeout=timeout
            )
        return cls(rank, world, local_rank, device, Heartbeat(rank, world), backend)

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over all processes (one collective for the list)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def any(self, flags: list[bool]) -> list[bool]:
        """Each flag true on any process."""
        return [v > 0 for v in self.sum([float(f) for f in flags])]

    def gather(self, obj) -> list:
        """`obj` from every process, in rank order, on every process."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def each(self, fn: Callable[[], T]) -> list[T]:
        """What `fn()` returns on each process, in rank order, on every process; an MtxError
        it raises on any process is raised on every process (the lowest rank's)."""
        result: Any = None
        error: str | None = None
        try:
            result = fn()
        except MtxError as e:
            error = str(e)
        every = self.gather((result, error))
        for _, failed in every:
            if failed is not None:
                raise MtxError(failed)
        return [r for r, _ in every]

    def broadcast(self, obj: T) -> T:
        """The main process's `obj` (anything picklable, tensors too) on every process."""
        if not self.enabled:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def decide(self, fn: Callable[[], T]) -> T:
        """What `fn()` returns on the main process, on every process; `fn` runs on the main
        process alone, and an MtxError it raises is raised on every process."""
        if not self.enabled:
            return fn()
        result: Any = None
        error: str | None = None
        if self.main:
            try:
                result = fn()
            except MtxError as e:
                error = str(e)
        result, error = self.broadcast((result, error))
        if error is not None:
            raise MtxError(error)
        return result

    def check_same_data(self, fingerprint: dict[str, str]) -> None:
        """Every process's prepared data must be rank 0's: compares `fingerprint` (the hashes
        of the pairs and of spm.model) across processes; a difference is the same one-line
        error on every process."""
        prints = self.gather(fingerprint)
        for rank, other in enumerate(prints):
            differ = [k for k in prints[0] if other.get(k) != prints[0][k]]
            if differ:
                what = ", ".join(
                    f"{k} {str(other.get(k))[:12]} (process 0: {str(prints[0][k])[:12]})"
                    for k in differ
                )
                raise MtxError(
                    f"process {rank}'s prepared data differs from process 0's: {what}; "
                    "prepare or copy the same data on every machine"
                )

    @staticmethod
    def is_collective_failure(error: BaseException) -> bool:
        """Whether `error` is a collective that failed (a peer gone, a timeout), as opposed to
        a fault of this process's own."""
        if isinstance(error, dist.DistError):
            return True
        text = str(error)
        return any(mark in text for mark in ("gloo", "NCCL", "Connection closed", "Timed out"))

    def failure(self, error: BaseException) -> MtxError:
        """The one-line error for a collective that failed on this process: which processes
        stopped answering (from the heartbeats), and what the backend said."""
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        silent = self.heartbeat.silent() if self.heartbeat else None
        if silent:
            who = ", ".join(map(str, silent))
            what = f"process {who} stopped answering (died or hangs)"
        elif silent is None:
            what = "the main node's store is gone (its machine or torchrun died)"
        else:
            what = "the other processes are alive but a collective failed"
        return MtxError(f"process {self.rank} of {self.world}: {what}: {first}")

    def close(self) -> None:
        if self.heartbeat:
            self.heartbeat.stop()
        if self.joined and dist.is_initialized():
            # DDP keeps itself (and the trainer that holds it) in reference cycles, so it and
            # its hold on the process group would go only when the collector next runs: perhaps
            # while the interpreter shuts down, where a gloo thread coming back for the GIL is
            # ended inside C++ and aborts a finished job (SIGABRT, "terminate called without an
            # active exception"). Collected here, the group goes down while all is alive.
            gc.collect()
            dist.destroy_process_group()


@contextlib.contextmanager
def joined(device: torch.device, timeout_s: float, backend: str | None = None) -> Iterator[Dist]:
    """This process in torchrun's process group for one job (`Dist.from_env`; alone without
    torchrun): a collective that fails inside becomes the one line naming the processes that
    stopped answering (`Dist.failure`), and the group is left at the end (`Dist.close`)."""
    dist = Dist.from_env(device, timeout_s, backend)
    try:
        yield dist
    except RuntimeError as e:
        if dist.joined and dist.is_collective_failure(e):
            raise dist.failure(e) from None
        raise
    finally:
        dist.close()


def under_torchrun() -> bool:
    """Whether torchrun started this process (its rendezvous is there to join)."""
    return "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def attempt_store(name: str, timeout: timedelta) -> dist.Store:
    """A client of the store at MASTER_ADDR:MASTER_PORT (torchrun's), its keys prefixed with
    `name` and torchrun's attempt number (TORCHELASTIC_RESTART_COUNT)."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"mtx/{name}/attempt-{attempt}", store)
