"""Noticing a processor set on an attention module after a strategy was applied, at no per-call cost.

A module whose processor we replaced needs no routing hooks: our processor hands its own attention core to the
strategy. Hooks (and the module-global patches of :mod:`.patches`) are needed there only once something else runs
in it: diffusers' ``fuse_qkv_projections`` or ``set_default_attn_processor``, IP-Adapter loading, a user's
``set_attn_processor``. All of those go through the module's ``set_processor``, so that method is wrapped on the
class that defines it — once per class, counted, and put back when the last watcher leaves, like the module-global
patches — and a watched module that gets a new processor calls its watchers, which install the hooks then.

Why not simply hook every module up front: with a forward hook, torch runs a module through its slow hook path,
about 10 µs per attention call on a CPU, as much as a small model's whole attention core. A model that keeps our
processors never pays it.

A copy of a model (``copy.deepcopy``) keeps our processors, which keep routing, but is not watched: a processor set
on the copy later is not routed.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Dict, List

from torch import nn

Watcher = Callable[[nn.Module], None]

_lock = threading.RLock()
#: module -> its watchers, in the order they were added (weak: a dropped model takes its entry with it).
_WATCHERS: "weakref.WeakKeyDictionary[nn.Module, List[Watcher]]" = weakref.WeakKeyDictionary()
#: class whose own ``set_processor`` we wrapped -> [the original function, how many watches rely on it].
_WRAPPED: Dict[type, List[Any]] = {}


def _defining_class(module: nn.Module) -> type:
    for klass in type(module).__mro__:
        if "set_processor" in vars(klass):
            return klass
    raise TypeError(f"{type(module).__name__} has no set_processor method; it is not a diffusers attention module")


def _watching(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_processor(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        for watcher in list(_WATCHERS.get(self, ())):
            watcher(self)
        return result

    set_processor.__npu_port_original__ = original  # type: ignore[attr-defined]
    return set_processor


def watch(module: nn.Module, watcher: Watcher) -> Callable[[], None]:
    """Call ``watcher(module)`` after every ``module.set_processor(...)``; returns the function that stops it."""
    klass = _defining_class(module)
    with _lock:
        entry = _WRAPPED.get(klass)
        if entry is None:
            original = vars(klass)["set_processor"]
            entry = _WRAPPED[klass] = [original, 0]
            klass.set_processor = _watching(original)
        entry[1] += 1
        _WATCHERS.setdefault(module, []).append(watcher)

    def unwatch() -> None:
        with _lock:
            watchers = _WATCHERS.get(module)
            if watchers is None or watcher not in watchers:
                return  # already stopped
            watchers.remove(watcher)
            if not watchers:
                del _WATCHERS[module]
            entry[1] -= 1
            if entry[1] <= 0 and _WRAPPED.get(klass) is entry:
                del _WRAPPED[klass]
                current = vars(klass).get("set_processor")
                if getattr(current, "__npu_port_original__", None) is entry[0]:  # someone else's wrapper stays
                    klass.set_processor = entry[0]

    return unwatch


def wrapped_classes() -> List[str]:
    """Classes whose ``set_processor`` is wrapped right now (for tests and ``explain``)."""
    with _lock:
        return sorted(f"{k.__module__}.{k.__qualname__}" for k in _WRAPPED)
