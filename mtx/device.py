"""Which device a command runs on: shared by training and translation."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mtx.errors import MtxError

if TYPE_CHECKING:  # imported where a device is picked: `mtx serve`'s HTTP process uses cores()
    import torch  # and never imports torch (serve/front.py)


def pick_device(name: str, key: str = "train.device") -> torch.device:
    """The device `name` says ("auto": CUDA if there is one, else the CPU); under torchrun,
    CUDA means this process's GPU. `key` names the setting in the error."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MtxError(f"{key} is {name!r} but no CUDA device is available")
    if name.startswith("cuda") and "WORLD_SIZE" in os.environ:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


def cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def auto_dtype(device: torch.device) -> torch.dtype:
    """What "auto" precision computes in, for training and decoding alike: bf16 on a GPU that
    supports it, else fp32."""
    import torch

    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16 else torch.float32
