"""Referring to a user's model without keeping it alive.

npu-port's bookkeeping (a strategy handle, the record of what was applied where, the watchers of ``set_processor``)
outlives the calls that made it, and sits in module-level tables. If any of it held a model strongly, a model the
user dropped without calling ``restore()`` would never be freed — on an accelerator, one model's device memory per
swapped pipeline. So every reference from our records to a user's object goes through :func:`weak`, and what is
computed from a user's tensor and kept for the next call (a converted attention mask, a gathered key mask) is kept
in a :class:`Memo`.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional, TypeVar

T = TypeVar("T")


def weak(obj: Any) -> Callable[[], Optional[Any]]:
    """A zero-argument callable that gives ``obj`` back while it lives and None once it is gone.

    ``None`` gives a callable that always answers None; an object that cannot be weakly referenced (a few builtins)
    is held strongly, since there is nothing else to do with it.
    """
    if obj is None:
        return _none
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _none() -> None:
    return None


def tensor_version(tensor: Any) -> Optional[int]:
    """The version counter of a tensor (bumped by every in-place change), or None for an inference tensor, which has
    none: such a tensor can change without anyone being able to tell, so what is derived from it is never kept."""
    return None if tensor.is_inference() else tensor._version


class _Entry:
    __slots__ = ("ref", "version", "values")

    def __init__(self, ref: "weakref.ref[Any]", version: Hashable) -> None:
        self.ref = ref
        self.version = version
        self.values: "OrderedDict[Hashable, Any]" = OrderedDict()


class Memo:
    """Values derived from an object, kept while that very object lives and is unchanged — computed once for the
    layers of a model that all pass the same mask tensor, where computing them costs a device synchronisation or an
    allocation the size of the attention scores.

    An entry is found by the object's identity (held weakly: a value never keeps its source alive, and is dropped
    the moment the source is freed) and a ``version`` the caller reads from it (a tensor's :func:`tensor_version`):
    a changed version recomputes. ``version=None`` means the object cannot tell a change, and nothing is kept. Each
    source holds up to ``per_source`` values under their keys, and up to ``capacity`` sources are kept, the least
    recently used going first. Values must not refer to their source (a view of it would keep it alive forever).
    """

    def __init__(self, capacity: int = 16, per_source: int = 16) -> None:
        self.capacity = capacity
        self.per_source = per_source
        self.computed = 0  # how many values were computed (what tests count)
        self._entries: "OrderedDict[int, _Entry]" = OrderedDict()
        self._lock = threading.RLock()  # re-entrant: a source freed while the lock is held runs _forget here

    def get(self, source: Any, version: Optional[Hashable], key: Hashable, compute: Callable[[], T]) -> T:
        """The value kept under ``key`` for ``source`` at ``version``, or ``compute()`` (then kept)."""
        if version is None:
            self.computed += 1
            return compute()
        ident = id(source)
        with self._lock:
            entry = self._entries.get(ident)
            if entry is not None and entry.ref() is source and entry.version == version and key in entry.values:
                self._entries.move_to_end(ident)
                return entry.values[key]
        value = compute()  # outside the lock: it may be slow, and may use this memo itself
        with self._lock:
            self.computed += 1
            entry = self._entries.get(ident)
            if entry is None or entry.ref() is not source or entry.version != version:
                entry = self._entries[ident] = _Entry(weakref.ref(source, self._forget(ident)), version)
            entry.values[key] = value
            if len(entry.values) > self.per_source:
                entry.values.popitem(last=False)
            self._entries.move_to_end(ident)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return value

    def _forget(self, ident: int) -> Callable[["weakref.ref[Any]"], None]:
        def forget(ref: "weakref.ref[Any]") -> None:
            with self._lock:
                entry = self._entries.get(ident)
                if entry is not None and entry.ref is ref:
                    del self._entries[ident]

        return forget

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
