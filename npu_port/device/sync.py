"""Waiting for a device and naming it: what timing code needs on any backend.

Timing an asynchronous device (cuda, npu, xpu, mps) without synchronising measures the launch, not the kernel;
``synchronize`` waits on whatever backend the tensors live on (a no-op on cpu). ``device_name`` gives the model
name that keys cached measurements: a decision measured on one GPU model is not reused on another.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from typing import Union

import torch


def _backend_module(device: torch.device):
    return getattr(torch, device.type, None)  # torch.cuda, torch.npu (after torch_npu), torch.xpu, torch.mps


def synchronize(device: Union[torch.device, str, None] = None) -> None:
    """Block until work queued on ``device`` is done (no-op on cpu and on backends without a synchronize)."""
    device = torch.device(device if device is not None else "cpu")
    if device.type in ("cpu", "meta"):
        return
    sync = getattr(_backend_module(device), "synchronize", None)
    if sync is None:
        return
    try:
        sync(device) if device.type != "mps" else sync()
    except TypeError:
        sync()


@lru_cache(maxsize=None)
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: Union[torch.device, str, None] = None) -> str:
    """A human-readable model name: ``"cpu: AMD EPYC ... (2 threads)"``, ``"cuda: NVIDIA H100 80GB HBM3"``."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cpu":
        return f"cpu: {_cpu_name()} ({torch.get_num_threads()} threads)"
    get_name = getattr(_backend_module(device), "get_device_name", None)
    if get_name is not None:
        try:
            return f"{device.type}: {get_name(device)}"
        except Exception:  # a backend without a driver: the type is still a useful key
            pass
    return device.type
