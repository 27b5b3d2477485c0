"""Data-parallel training over the processes `torchrun` starts (one per GPU; CPU processes too).

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE and runs the rendezvous, on one machine or many;
mtx joins the process group (NCCL on GPUs, gloo on CPUs) and wraps the model in torch's
DistributedDataParallel, which averages the gradients across processes during the backward
pass. Without torchrun (WORLD_SIZE unset or 1) nothing here communicates.

A collective that waits longer than TIMEOUT fails instead of hanging; torchrun then stops the
other processes and the job exits with the error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(minutes=15)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The process that writes checkpoints, metrics, logs and progress."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, device: torch.device) -> Dist:
        """Join torchrun's process group if there is one; `device` picks the backend."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=TIMEOUT)
        return cls(rank, world, local_rank)

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Each value summed over all processes (one collective for the list)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def any(self, flags: list[bool], device: torch.device) -> list[bool]:
        """Each flag true on any process: decisions every process must take together."""
        return [v > 0 for v in self.sum([float(f) for f in flags], device)]

    def gather(self, obj) -> list:
        """`obj` from every process, in rank order."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()
