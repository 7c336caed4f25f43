"""Peak memory of one attention call, on any device: what "this strategy needs N MiB here" rests on.

On cuda / npu / xpu the allocator keeps the statistic: reset the peak, run, read ``max_memory_allocated`` minus what
was allocated before. On CPU there is no allocator statistic, and the process's resident size only ever grows, so a
``TorchDispatchMode`` (:class:`AllocationTracker`) counts the storages each ATen operation creates and frees: the
peak of live allocations and the largest single one. It sees every tensor an op returns — including the
``B*H*Sq*Skv`` score tensor a materialising kernel creates — but not the scratch space a fused kernel allocates
internally (torch's CPU flash kernel's per-thread blocks), so CPU figures are a lower bound for fused kernels. It
works on the ``meta`` device too, which is how the tests check ControlVideo's size without the memory.
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional, Tuple, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

T = TypeVar("T")


class AllocationTracker(TorchDispatchMode):
    """Live, peak and largest storage bytes created by the ops run inside the mode (views and in-place: none)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.largest = 0
        self._seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata for t in tree_flatten((args, kwargs or {}))[0] if hasattr(t, "untyped_storage")
        }
        for tensor in tree_flatten(out)[0]:
            if not hasattr(tensor, "untyped_storage"):
                continue
            key = tensor.untyped_storage()._cdata  # the StorageImpl's address: one key per storage, meta included
            if key in self._seen or key in inputs:  # views and in-place results allocate nothing
                continue
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            self._seen.add(key)
            self.live += size
            self.largest = max(self.largest, size)
            self.peak = max(self.peak, self.live)
            weakref.finalize(tensor, self._free, key, size)
        return out

    def _free(self, key, size) -> None:
        if key in self._seen:
            self._seen.discard(key)
            self.live -= size


def _allocator(device: torch.device):
    """The device module if it keeps allocator statistics (torch.cuda, torch.npu, torch.xpu), else None."""
    module = getattr(torch, device.type, None)
    needed = ("reset_peak_memory_stats", "max_memory_allocated", "memory_allocated", "synchronize")
    if device.type == "cpu" or module is None or not all(hasattr(module, n) for n in needed):
        return None
    return module


def method(device: torch.device) -> str:
    """How :func:`peak_bytes` measures on ``device`` (recorded with the results)."""
    if device.type == "cpu":
        return "live tensors created by the call (TorchDispatchMode; fused kernels' internal scratch not seen)"
    module = _allocator(device)
    if module is None:
        return "not measured: this backend keeps no allocator statistics"
    return f"torch.{device.type}.max_memory_allocated() during the call, minus what was allocated before"


def peak_bytes(fn: Callable[[], T], device: torch.device) -> Tuple[T, Optional[int]]:
    """``fn()``'s result and the extra peak memory it took on ``device`` (its output included); None if unknown."""
    if device.type == "cpu":
        tracker = AllocationTracker()
        with tracker:
            out = fn()
        return out, tracker.peak
    module = _allocator(device)
    if module is None:
        return fn(), None
    module.synchronize(device)
    module.reset_peak_memory_stats(device)
    before = module.memory_allocated(device)
    out = fn()
    module.synchronize(device)
    return out, max(0, module.max_memory_allocated(device) - before)
