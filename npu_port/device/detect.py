"""Which accelerator this process can really use, asked honestly.

``torch.cuda.is_available()`` is not a safe question on Ascend: torch_npu's ``transfer_to_npu`` makes it return True,
and a torch_npu wheel without CANN is *installed* yet fails to import. Here each backend is probed on its own terms,
NPU first (so a patched ``torch.cuda`` cannot win), and a backend that cannot be used carries the reason, which
``npu-port doctor`` and error messages print. Nothing is imported or initialised until a function is called.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

from .._optional import probe
from ..errors import DeviceError
from ..reasons import Reason

#: Accelerators in order of preference; cpu is always last and always there.
DEVICE_TYPES: Tuple[str, ...] = ("npu", "cuda", "xpu", "mps", "cpu")
#: Environment variable that overrides detection (a device type, optionally with ``:index``, or ``auto``).
ENV_VARIABLE = "NPU_PORT_DEVICE"

# Saved when this module is first imported, before any redirect can patch it: detection must see the truth.
_cuda_is_available = torch.cuda.is_available
_cuda_device_count = torch.cuda.device_count

DeviceLike = Union[str, torch.device, None]


@dataclass(frozen=True)
class BackendStatus:
    """One backend on this machine: usable or not, how many devices, and why not."""

    type: str
    available: bool
    count: int
    reason: Optional[Reason] = None


def _npu_status() -> BackendStatus:
    package = probe("torch_npu")
    if not package.ok:
        return BackendStatus("npu", False, 0, package.reason)
    npu = getattr(torch, "npu", None)
    try:
        count = int(npu.device_count()) if npu is not None and npu.is_available() else 0
    except Exception as exc:  # a driver that answers with an error: not usable, and say so
        return BackendStatus("npu", False, 0, Reason("device-error", f"torch.npu failed: {type(exc).__name__}: {exc}"))
    if count == 0:
        return BackendStatus(
            "npu", False, 0, Reason("no-device", "torch_npu imports but sees no NPU (driver / visibility)")
        )
    return BackendStatus("npu", True, count)


def _cuda_status() -> BackendStatus:
    if torch.version.cuda is None and torch.version.hip is None:
        return BackendStatus(
            "cuda", False, 0, Reason("not-built", f"this torch {torch.__version__} has no CUDA support")
        )
    try:
        if _cuda_is_available():
            return BackendStatus("cuda", True, int(_cuda_device_count()))
    except Exception as exc:
        return BackendStatus(
            "cuda", False, 0, Reason("device-error", f"torch.cuda failed: {type(exc).__name__}: {exc}")
        )
    return BackendStatus("cuda", False, 0, Reason("no-device", "torch has CUDA support but sees no GPU (driver?)"))


def _xpu_status() -> BackendStatus:
    xpu = getattr(torch, "xpu", None)
    try:
        if xpu is not None and xpu.is_available():
            return BackendStatus("xpu", True, int(xpu.device_count()))
    except Exception as exc:
        return BackendStatus("xpu", False, 0, Reason("device-error", f"torch.xpu failed: {type(exc).__name__}: {exc}"))
    return BackendStatus("xpu", False, 0, Reason("no-device", "no Intel GPU (torch.xpu.is_available() is False)"))


def _mps_status() -> BackendStatus:
    try:
        if torch.backends.mps.is_available():
            return BackendStatus("mps", True, 1)
    except Exception as exc:
        return BackendStatus("mps", False, 0, Reason("device-error", f"torch.mps failed: {type(exc).__name__}: {exc}"))
    return BackendStatus(
        "mps", False, 0, Reason("no-device", "no Apple GPU (torch.backends.mps.is_available() is False)")
    )


#: What each device type is, as a sentence names it ("needs an Ascend NPU").
DEVICE_LABELS = {
    "npu": "an Ascend NPU",
    "cuda": "a CUDA GPU",
    "xpu": "an Intel GPU",
    "mps": "an Apple GPU",
    "cpu": "a CPU",
}


_PROBES = {"npu": _npu_status, "cuda": _cuda_status, "xpu": _xpu_status, "mps": _mps_status}


def backend_status(device_type: str) -> BackendStatus:
    """Whether ``device_type`` (npu, cuda, xpu, mps, cpu) can be used here; never raises for a known type."""
    if device_type == "cpu":
        return BackendStatus("cpu", True, 1)
    probe_backend = _PROBES.get(device_type)
    if probe_backend is None:
        raise DeviceError(f"unknown device type {device_type!r}; valid types: {', '.join(DEVICE_TYPES)}")
    return probe_backend()


def device_requirement(device_type: Optional[str]) -> Optional[Reason]:
    """Why something that needs ``device_type`` cannot run here ("needs an Ascend NPU: torch_npu is not installed;
    ..."), with the backend's own reason code; None when it can (or needs no particular device: none, or ``auto``,
    the best device here)."""
    if device_type is None or device_type == "auto":
        return None
    status = backend_status(device_type)
    if status.available:
        return None
    return Reason(status.reason.code, f"needs {DEVICE_LABELS[device_type]}: {status.reason}")


def backends() -> Tuple[BackendStatus, ...]:
    """Every backend in preference order, usable or not (what ``npu-port doctor`` lists)."""
    return tuple(backend_status(kind) for kind in DEVICE_TYPES)


def available_device_types() -> Tuple[str, ...]:
    return tuple(status.type for status in backends() if status.available)


def _parse(text: str, origin: str) -> Tuple[str, Optional[int]]:
    kind, _, index_text = text.strip().lower().partition(":")
    if kind not in DEVICE_TYPES and kind != "auto":
        raise DeviceError(f"unknown device {text!r} ({origin}); valid devices: auto, {', '.join(DEVICE_TYPES)}")
    if not index_text:
        return kind, None
    if kind == "auto" or not index_text.isdigit():
        raise DeviceError(f"bad device {text!r} ({origin}); write a type with an optional index, e.g. npu:0 or cpu")
    return kind, int(index_text)


def get_device(device: DeviceLike = None) -> torch.device:
    """The device to run on: ``device`` if given, else ``$NPU_PORT_DEVICE``, else the best usable accelerator.

    Preference is npu, cuda, xpu, mps, cpu. A device that is named but unusable is an error naming the reason and
    what this machine has, never a silent fall back to another device.
    """
    if isinstance(device, torch.device):
        text, origin = str(device), "argument"
    elif device is not None:
        text, origin = str(device), "argument"
    else:
        text, origin = os.environ.get(ENV_VARIABLE, "").strip() or "auto", f"${ENV_VARIABLE}"
    kind, index = _parse(text, origin)
    if kind == "auto":
        kind = available_device_types()[0]
        return torch.device(kind) if kind == "cpu" else torch.device(kind, 0)
    status = backend_status(kind)
    if not status.available:
        usable = ", ".join(available_device_types())
        raise DeviceError(f"device {text!r} ({origin}) is not usable here: {status.reason}; usable: {usable}")
    if kind == "cpu":
        return torch.device("cpu")
    if index is not None and index >= status.count:
        raise DeviceError(
            f"device {text!r} ({origin}) does not exist: this machine has {status.count} {kind} device(s)"
        )
    return torch.device(kind, index or 0)
