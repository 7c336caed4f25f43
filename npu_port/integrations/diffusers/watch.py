"""Noticing a processor set on an attention module after a strategy was applied, at no per-call cost.

A module whose processor we replaced needs no routing hooks: our processor hands its own attention core to the
strategy. Hooks (and the patches of :mod:`.patches`) are needed there only once something else runs in it:
diffusers' ``fuse_qkv_projections``, ``set_default_attn_processor`` or attention slicing, IP-Adapter loading, a
user's ``set_attn_processor``. All of those go through the module's ``set_processor``, so that method is wrapped on
the class that defines it — once per class, counted, and put back when the last watched module of that class goes —
and a watched module that gets a new processor calls its watchers, which route the new processor then.

Why not simply hook every module up front: with a forward hook, torch runs a module through its slow hook path,
about 10 µs per attention call on a CPU, as much as a small model's whole attention core. A model that keeps our
processors never pays it.

Nothing here keeps a model alive. The table is keyed by ``id(module)`` and holds a weak reference whose callback
drops the entry — and the class's count — when the module is freed, so a model dropped without ``restore()`` goes,
and the table does not grow with models that are gone. Watchers are called with the module; they must not hold it.

A copy of a model (``copy.deepcopy``) keeps our processors, which keep routing, but is not watched: a processor set
on the copy later is not routed.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable, Dict, List

from torch import nn

from ... import _patching
from ...upstream.diffusers.attention import SET_PROCESSOR

Watcher = Callable[[nn.Module], None]

#: The key of the ``set_processor`` patches (one per class, counted by the modules watched through it).
KEY = "diffusers:watch"


class _Watched:
    """One watched module: a weak reference to it, the patch of its class's ``set_processor``, and its watchers in
    the order they were added."""

    __slots__ = ("ref", "patch", "watchers")

    def __init__(self, ref: "weakref.ref[nn.Module]", patch: _patching.Patch) -> None:
        self.ref = ref
        self.patch = patch
        self.watchers: List[Watcher] = []


#: id(module) -> its entry; the weak reference's callback removes the entry when the module is freed.
_WATCHED: Dict[int, _Watched] = {}


def _defining_class(module: nn.Module) -> type:
    for klass in type(module).__mro__:
        if SET_PROCESSOR in vars(klass):
            return klass
    raise TypeError(f"{type(module).__name__} has no {SET_PROCESSOR} method; it is not a diffusers attention module")


def _watching(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def set_processor(self: nn.Module, *args: object, **kwargs: object) -> object:
        result = original(self, *args, **kwargs)
        entry = _WATCHED.get(id(self))
        if entry is not None and entry.ref() is self:
            for watcher in list(entry.watchers):
                watcher(self)
        return result

    set_processor.__npu_port_original__ = original  # type: ignore[attr-defined]
    return set_processor


def _class_patch(klass: type) -> _patching.Patch:
    """Hold the wrap of ``klass.set_processor`` (made on first use; joined, even if someone wrapped it since)."""
    patch = _patching.find(klass, SET_PROCESSOR, KEY)
    if patch is not None:
        return _patching.hold(patch)
    return _patching.replace(klass, SET_PROCESSOR, _watching(vars(klass)[SET_PROCESSOR]), key=KEY)


def _drop(key: int, entry: _Watched) -> None:
    """Forget a watched module; the last one of its class puts ``set_processor`` back (if still ours)."""
    del _WATCHED[key]
    _patching.release(entry.patch)


def _forget(key: int) -> Callable[["weakref.ref[nn.Module]"], None]:
    def freed(ref: "weakref.ref[nn.Module]") -> None:  # the module is gone: its entry and its count go with it
        with _patching.LOCK:
            entry = _WATCHED.get(key)
            if entry is not None and entry.ref is ref:
                _drop(key, entry)

    return freed


def watch(module: nn.Module, watcher: Watcher) -> Callable[[], None]:
    """Call ``watcher(module)`` after every ``module.set_processor(...)``; returns the function that stops it.

    Neither the table nor the returned function keeps ``module`` alive.
    """
    klass = _defining_class(module)
    key = id(module)
    with _patching.LOCK:
        entry = _WATCHED.get(key)
        if entry is not None and entry.ref() is not module:  # a freed module's id, reused before its callback ran
            _drop(key, entry)
            entry = None
        if entry is None:
            entry = _WATCHED[key] = _Watched(weakref.ref(module, _forget(key)), _class_patch(klass))
        entry.watchers.append(watcher)
    ref = entry.ref

    def unwatch() -> None:
        with _patching.LOCK:
            current = _WATCHED.get(key)
            if current is None or current.ref is not ref or watcher not in current.watchers:
                return  # already stopped, or the module is gone
            current.watchers.remove(watcher)
            if not current.watchers:
                _drop(key, current)

    return unwatch


def watched_modules() -> int:
    """How many modules are watched right now (for tests: it must not grow with models that are gone)."""
    with _patching.LOCK:
        return len(_WATCHED)


def wrapped_classes() -> List[str]:
    """Classes whose ``set_processor`` is wrapped right now (for tests and ``explain``)."""
    return sorted(_patching.describe_owner(p.owner) for p in _patching.active(lambda key: key == KEY))
