"""Device-generic stand-ins for ``torch.cuda.*`` housekeeping: one call that works on npu, cuda, xpu, mps and cpu.

Ported code that calls ``torch.cuda.synchronize()`` or ``torch.cuda.max_memory_allocated()`` breaks on every other
device. These take any device (default: :func:`~npu_port.device.detect.get_device`) and call the matching backend
module. On cpu there is no device allocator: allocation statistics read 0, ``mem_get_info`` reports host memory,
and synchronising or emptying a cache does nothing — the answers a CPU run of CUDA code should see.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

import torch
from torch.torch_version import TorchVersion

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


#: Autocast device types of torch before 2.4, which has no ``is_autocast_available`` (besides the privateuse1
#: backend, ``npu`` once torch_npu is loaded).
_AUTOCAST_TYPES = ("cuda", "cpu", "xpu", "hpu", "ipu", "xla")


def _autocast_available(kind: str) -> bool:
    check = getattr(torch.amp.autocast_mode, "is_autocast_available", None)  # torch >= 2.4
    if check is not None:
        return bool(check(kind))
    return kind in _AUTOCAST_TYPES or kind == torch._C._get_privateuse1_backend_name()


def _cuda_autocast_dtype() -> torch.dtype:
    """What ``torch.autocast("cuda")`` takes when given no dtype: float16, unless the program set another."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4 (get_autocast_gpu_dtype warns there)
        return torch.get_autocast_dtype("cuda")
    return torch.get_autocast_gpu_dtype()


def autocast(
    dtype: Optional[torch.dtype] = None,
    enabled: bool = True,
    cache_enabled: Optional[bool] = None,
    *,
    device: DeviceLike = None,
) -> torch.autocast:
    """``torch.autocast("cuda", dtype, enabled, cache_enabled)`` for the device npu-port detects (or ``device``):
    what ``npu-port fix`` writes for CUDA autocast, as a context manager or a decorator.

    On CUDA it *is* that call (``dtype=None``: torch's CUDA default, float16 unless the program set another;
    ``cache_enabled=None``: the current setting). Elsewhere ``dtype=None`` still means CUDA's dtype, so the region
    computes what the code was written to compute (the cpu's own default would be bfloat16) — as ``npu-port run``'s
    redirect does. Where torch's autocast cannot run the region — torch 2.1's CPU autocast takes only bfloat16 and
    raises on entering with another dtype; mps has no autocast before torch 2.5 — the region runs without autocast
    (float32) with a warning: what CUDA autocast does where there is no CUDA, without the crash.
    """
    kind = _device_type(device)
    if kind == "cuda":
        return torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    if dtype is None:
        dtype = _cuda_autocast_dtype()
    old_cpu = kind == "cpu" and dtype != torch.bfloat16 and TorchVersion(torch.__version__) < (2, 2)
    if old_cpu or not _autocast_available(kind):
        if enabled:
            warnings.warn(
                f"npu-port: torch {torch.__version__} has no {kind} autocast to {dtype}: the region runs without "
                "autocast (float32)",
                stacklevel=2,
            )
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=False, cache_enabled=cache_enabled)
    return torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def grad_scaler(
    init_scale: float = 2.0**16,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
    enabled: bool = True,
    *,
    device: DeviceLike = None,
):
    """A gradient scaler for the device npu-port detects (or ``device``), with ``torch.cuda.amp.GradScaler``'s
    arguments: what ``npu-port fix`` writes for a CUDA GradScaler.

    The class depends on the device and the torch version, which is why this is a function and not
    ``torch.amp.GradScaler(device)`` written in place: that class exists from torch 2.3 only. On CUDA:
    ``torch.amp.GradScaler("cuda", ...)`` (what ``torch.cuda.amp.GradScaler`` calls), or ``torch.cuda.amp.GradScaler``
    before 2.3. On an NPU: torch_npu's ``torch_npu.npu.amp.GradScaler`` — the one Ascend documents, and the only one
    that sees overflow on chips without inf/nan mode (it reads the NPU's overflow flag; torch's scaler looks for inf
    in the gradients, which saturate there) and agrees on it across ranks. Elsewhere ``torch.amp.GradScaler(type)``;
    where this torch has none for the device (before 2.3), a disabled scaler, with a warning — what a CUDA
    GradScaler does where there is no CUDA.
    """
    kind = _device_type(device)
    options = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor)
    options.update(growth_interval=growth_interval, enabled=enabled)
    if kind == "npu":
        from torch_npu.npu.amp import GradScaler as NpuGradScaler

        return NpuGradScaler(**options)
    generic = getattr(torch.amp, "GradScaler", None)  # torch >= 2.3
    if generic is not None:
        return generic(kind, **options)
    if kind != "cuda":
        if enabled:
            warnings.warn(
                f"npu-port: torch {torch.__version__} has no GradScaler for {kind} (torch.amp.GradScaler comes with "
                "torch 2.3): gradient scaling is off",
                stacklevel=2,
            )
        options["enabled"] = False
    return torch.cuda.amp.GradScaler(**options)
