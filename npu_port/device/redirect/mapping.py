"""Turning a CUDA device argument into the target's — and leaving everything else exactly as it was.

transfer_to_npu rewrites any positional string that contains "cuda", so ``torch.load("x_cuda.pt")`` opens
``x_npu.pt``. Here only values in a device position are looked at, and only ``"cuda"``, ``"cuda:N"``,
``torch.device("cuda", N)`` and (where torch reads them as CUDA ordinals) plain ints are rewritten. On a cpu target
the index is dropped (there is one cpu); on npu / xpu it is kept.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import torch
from torch.serialization import default_restore_location

_CUDA_STRING = re.compile(r"cuda(?::(\d+))?\Z")


class DeviceMapper:
    """Maps CUDA device arguments onto ``target`` (a device type such as "cpu" or "npu")."""

    def __init__(self, target: str):
        self.target = target
        self.indexed = target != "cpu"
        #: False once the redirect is uninstalled: a wrapper that another patch still calls passes through then.
        self.live = True

    def _string(self, index: Optional[int]) -> str:
        if not self.indexed:
            return self.target
        return f"{self.target}:{index}" if index is not None else self.target

    def is_cuda(self, value: Any) -> bool:
        kind = type(value)
        if kind is str:
            return _CUDA_STRING.match(value) is not None
        if kind is torch.device:
            return value.type == "cuda"
        return False

    def device(self, value: Any, *, ints: bool = True) -> Any:
        """``value`` mapped if it names a CUDA device, else ``value`` itself (the same object)."""
        kind = type(value)
        if kind is str:
            if not value.startswith("cuda"):
                return value
            match = _CUDA_STRING.match(value)
            if match is None:
                return value
            return self._string(int(match.group(1)) if match.group(1) is not None else None)
        if kind is torch.device:
            if value.type != "cuda":
                return value
            return torch.device(self._string(value.index))
        if ints and kind is int and value >= 0:
            return self._string(value)
        return value

    def map_location(self, value: Any) -> Any:
        """``torch.load``'s ``map_location``: None gets a loader that lands CUDA-saved storages on the target."""
        if value is None:
            return self._restore_cuda_storages
        if isinstance(value, dict):
            return {key: self.device(item, ints=False) for key, item in value.items()}
        if callable(value):
            return value
        return self.device(value)

    def _restore_cuda_storages(self, storage, location: str):
        match = _CUDA_STRING.match(location)
        if match is None:
            return default_restore_location(storage, location)
        return default_restore_location(storage, self._string(int(match.group(1)) if match.group(1) else None))
