"""Device-generic stand-ins for ``torch.cuda.*`` housekeeping: one call that works on npu, cuda, xpu, mps and cpu.

Ported code that calls ``torch.cuda.synchronize()`` or ``torch.cuda.max_memory_allocated()`` breaks on every other
device. These take any device (default: :func:`~npu_port.device.detect.get_device`) and call the matching backend
module. On cpu there is no device allocator: allocation statistics read 0, ``mem_get_info`` reports host memory,
and synchronising or emptying a cache does nothing — the answers a CPU run of CUDA code should see.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from .detect import DEVICE_TYPES, ENV_VARIABLE, DeviceLike, backend_status, get_device
from .memory import host_memory_bytes
from .sync import synchronize as _synchronize_device

#: The dtype autocast uses by default on each device type (CUDA's and Ascend's float16, the CPU's bfloat16).
AUTOCAST_DTYPES = {"cuda": torch.float16, "npu": torch.float16, "xpu": torch.bfloat16, "mps": torch.float16}


def _device(device: DeviceLike) -> torch.device:
    """``device`` checked the way :func:`get_device` checks it: an unusable device is a clear error, not torch's.

    None means what ``torch.cuda``'s functions mean by it: the *current* device of the detected type (the one
    ``torch.cuda.set_device(rank)`` / ``torch.npu.set_device`` chose), unless ``$NPU_PORT_DEVICE`` names one.
    """
    if isinstance(device, int):
        return get_device(f"{get_device().type}:{device}")
    found = get_device(device)
    if device is None and found.type != "cpu" and not os.environ.get(ENV_VARIABLE, "").strip():
        current = getattr(_backend(found), "current_device", None)
        if callable(current):
            return torch.device(found.type, current())
    return found


def _device_type(device: DeviceLike) -> str:
    """Only the type (no probing): what autocast questions need, also for a device this machine lacks."""
    if isinstance(device, str):
        kind = device.partition(":")[0].strip().lower()
        if kind in DEVICE_TYPES:
            return kind
    if isinstance(device, torch.device):
        return device.type
    return _device(device).type


def _backend(device: torch.device):
    return getattr(torch, device.type, None)


def _call(device: torch.device, name: str, *args, default=None):
    function = getattr(_backend(device), name, None)
    if function is None:
        return default
    return function(*args)


def synchronize(device: DeviceLike = None) -> None:
    """Wait for queued work on ``device`` (what timing code needs before reading a clock)."""
    _synchronize_device(_device(device))


def empty_cache(device: DeviceLike = None) -> None:
    """Give cached, unused device memory back to the driver (no-op on cpu)."""
    device = _device(device)
    if device.type != "cpu":
        _call(device, "empty_cache")


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by tensors on ``device`` now (0 on cpu, which has no device allocator)."""
    device = _device(device)
    if device.type in ("cpu", "mps"):
        return 0 if device.type == "cpu" else int(torch.mps.current_allocated_memory())
    return int(_call(device, "memory_allocated", device, default=0))


def max_memory_allocated(device: DeviceLike = None) -> int:
    """Peak bytes held by tensors on ``device`` since the last reset (0 on cpu)."""
    device = _device(device)
    if device.type in ("cpu", "mps"):
        return 0 if device.type == "cpu" else int(torch.mps.current_allocated_memory())  # mps keeps no peak
    return int(_call(device, "max_memory_allocated", device, default=0))


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    device = _device(device)
    if device.type not in ("cpu", "mps"):
        _call(device, "reset_peak_memory_stats", device)


def mem_get_info(device: DeviceLike = None) -> Tuple[int, int]:
    """``(free, total)`` bytes on ``device``; host memory for cpu."""
    device = _device(device)
    if device.type == "cpu":
        return host_memory_bytes()
    if device.type == "mps":
        total = int(torch.mps.recommended_max_memory())
        return total - int(torch.mps.current_allocated_memory()), total
    free, total = _call(device, "mem_get_info", device)
    return int(free), int(total)


def manual_seed(seed: int) -> torch.Generator:
    """Seed every device's default generator (``torch.manual_seed`` already covers cuda, npu, xpu and mps)."""
    return torch.manual_seed(seed)


def device_count(device_type: Optional[str] = None) -> int:
    """How many devices of ``device_type`` (default: the detected device's type) this process can use."""
    kind = device_type or get_device().type
    return backend_status(kind).count


def autocast_device_type(device: DeviceLike = None) -> str:
    """The ``device_type`` to give ``torch.autocast`` for ``device`` (npu's is "npu" once torch_npu is loaded)."""
    return _device_type(device)


def autocast_dtype(device: DeviceLike = None) -> torch.dtype:
    """The dtype autocast uses by default on ``device`` when none is given."""
    return AUTOCAST_DTYPES.get(_device_type(device), torch.bfloat16)
