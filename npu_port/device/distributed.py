"""Which ``torch.distributed`` backend a device speaks, and a ``init_process_group`` that asks for it.

Part of the device layer. Code written for GPUs says ``backend="nccl"``; NCCL exists only on CUDA. On Ascend the
collective library is HCCL (``torch_npu`` registers ``hccl``), on a CPU it is gloo. Only the CUDA names are mapped:
a backend that is explicitly requested and cannot work here is an error naming what would, never a silent swap.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import DeviceError
from .detect import DeviceLike, get_device

#: The collective backend each device type uses.
BACKENDS = {"npu": "hccl", "cuda": "nccl", "xpu": "xccl", "cpu": "gloo", "mps": "gloo"}


def default_backend(device: DeviceLike = None) -> str:
    """hccl on an NPU, nccl on CUDA, gloo on cpu (``device`` defaults to :func:`npu_port.get_device`)."""
    return BACKENDS.get(get_device(device).type, "gloo")


def map_backend(backend: Optional[str], device_type: str) -> Optional[str]:
    """``backend`` as ``device_type`` can run it: ``nccl`` (and ``cuda:nccl`` parts) become the device's backend.

    ``"cpu:gloo,cuda:nccl"`` becomes ``"cpu:gloo,npu:hccl"`` on an NPU and ``"cpu:gloo"`` on a cpu.
    """
    if backend is None or not isinstance(backend, str):
        return backend
    native = BACKENDS.get(device_type, "gloo")
    if ":" not in backend:
        name = backend.lower()
        if name == "nccl" and device_type != "cuda":
            return native
        if name == "hccl" and device_type != "npu":
            raise DeviceError(f"backend 'hccl' needs an Ascend NPU; this process runs on {device_type}: use '{native}'")
        return backend
    parts = []
    for part in backend.split(","):
        kind, _, name = part.strip().partition(":")
        if kind == "cuda" and device_type != "cuda":
            kind = device_type
            name = native if name.lower() == "nccl" else name
        entry = f"{kind}:{name}"
        if entry not in parts:
            parts.append(entry)
    return ",".join(parts)


def init_process_group(backend: Optional[str] = None, *args: Any, device: DeviceLike = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` with ``backend`` mapped to this device (default: its own backend)."""
    import torch.distributed as dist

    device_type = get_device(device).type
    backend = default_backend(device) if backend is None else map_backend(backend, device_type)
    dist.init_process_group(backend, *args, **kwargs)
