"""Count what an operation allocates, op by op, without a GPU: a TorchDispatchMode that tracks tensor storage.

It records the largest single allocation and the peak of live allocations (storages created inside the mode and
not yet freed), which is what "never materialises the B*H*Sq*Skv score tensor" means. It works on cpu and on the
``meta`` device, so real problem sizes (ControlVideo's 2 x 8 x 61440²) can be checked without the memory.
"""

from __future__ import annotations

import weakref

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class AllocationTracker(TorchDispatchMode):
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
