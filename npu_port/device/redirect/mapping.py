"""Turning a CUDA device argument into the target's — and leaving everything else exactly as it was.

transfer_to_npu rewrites any positional string that contains "cuda", so ``torch.load("x_cuda.pt")`` opens
``x_npu.pt``. Here only values in a device position are looked at, and only ``"cuda"``, ``"cuda:N"``,
``torch.device("cuda", N)`` and (where torch reads them as CUDA ordinals) plain ints are rewritten. On a cpu target
the index is dropped (there is one cpu); on npu / xpu it is kept.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from typing import Any, Callable, Dict, Iterator, Optional

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
        self._scope = threading.local()

    @contextlib.contextmanager
    def without_cuda_devices(self) -> Iterator[None]:
        """On this thread, meanwhile, ``torch.cuda.device_count()`` answers 0 on a cpu target (as on a machine
        without CUDA) instead of the cpu's 1: for libraries that place work on every CUDA ordinal they count."""
        depth = getattr(self._scope, "depth", 0)
        self._scope.depth = depth + 1
        try:
            yield
        finally:
            self._scope.depth = depth

    def counts_no_cuda_devices(self) -> bool:
        return getattr(self._scope, "depth", 0) > 0

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

    def map_location(self, value: Any, note: Optional[Callable[[str], None]] = None) -> Any:
        """``torch.load``'s ``map_location`` for the target, in each form torch takes.

        A device (``"cuda:1"``, ``torch.device("cuda")``) is mapped; an int is left alone (torch takes none, on CUDA
        either: it stays torch's own error). A dict keeps its keys (the tags the file was saved with) and has its
        values mapped. Where ``map_location`` says nothing about a storage saved on a CUDA device — None, a dict
        without its tag, a callable that returns None — the storage lands on the target instead of failing, and
        ``note(tag)`` is called (``npu-port run`` counts such loads apart: no CUDA was written in the call).
        """
        if value is None:
            return functools.partial(self._restore, note)
        if isinstance(value, dict):
            return _CudaTagsToTarget(self, note, {key: self.device(item, ints=False) for key, item in value.items()})
        if callable(value):
            return functools.partial(self._restore_after, value, note)
        return self.device(value, ints=False)

    def device_map(self, value: Any) -> Any:
        """``from_pretrained``'s ``device_map``: a CUDA device, alone or as a value of a dict, mapped (the same
        object back when nothing names CUDA). An ordinal is a CUDA ordinal on a cpu target, where
        ``torch.device(0)`` finds no accelerator, so it becomes ``"cpu"``; on an accelerator target the ordinal is
        that accelerator's own and stays. The automatic maps (``"auto"``, ``"balanced"``...) stay."""
        if isinstance(value, dict):
            mapped = {key: self._device_map_entry(item) for key, item in value.items()}
            return value if all(mapped[key] is value[key] for key in value) else mapped
        return self._device_map_entry(value)

    def _device_map_entry(self, value: Any) -> Any:
        if type(value) is int:
            return self.target if not self.indexed and value >= 0 else value
        return self.device(value, ints=False)

    def _target_of(self, location: str) -> Optional[str]:
        match = _CUDA_STRING.match(location)
        if match is None:
            return None
        return self._string(int(match.group(1)) if match.group(1) is not None else None)

    def _restore(self, note: Optional[Callable[[str], None]], storage: Any, location: str) -> Any:
        target = self._target_of(location)
        if target is None:
            return default_restore_location(storage, location)
        if note is not None:
            note(location)
        return default_restore_location(storage, target)

    def _restore_after(self, function: Callable, note: Optional[Callable[[str], None]], storage: Any, location: str):
        result = function(storage, location)  # torch: a callable's None means "where it was saved"
        return self._restore(note, storage, location) if result is None else result


class _CudaTagsToTarget(dict):
    """A dict ``map_location`` whose missing CUDA tags go to the target: torch reads it with ``.get(tag, tag)``, and
    on CUDA a tag the dict does not name stays where it was saved — a CUDA device, which here is the target. Equal
    to the plain dict of its items, so a dict that named no CUDA device compares unchanged."""

    def __init__(self, mapper: DeviceMapper, note: Optional[Callable[[str], None]], items: Dict[Any, Any]):
        super().__init__(items)
        self._mapper = mapper
        self._note = note

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        target = self._mapper._target_of(key) if type(key) is str else None
        if target is None:
            return default
        if self._note is not None:
            self._note(key)
        return target
