"""Watchers of routed attention calls: who wants to see every call a router runs, with its inputs and output.

``npu_port.diff.capture`` records each routed call (its query, key, value, mask and output) next to the module it
ran in, so that a comparison of two runs can point at one attention call rather than at the module around it. Nothing
is watched unless a watcher is registered: the router's only cost is one test of an empty list per call.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, List

#: Registered watchers, called as ``watcher(router, query, key, value, attn_mask, is_causal, scale, output)``.
WATCHERS: List[Callable[..., None]] = []
_local = threading.local()


def inside() -> bool:
    """Whether this thread is already inside a watched call (the router calls itself once to run it)."""
    return getattr(_local, "inside", False)


def observe(router: Any, query, key, value, attn_mask, **options: Any):
    """Run ``router``'s call once and show it to every watcher; a watcher's error is the watcher's to report."""
    _local.inside = True
    try:
        output = router(query, key, value, attn_mask, **options)
    finally:
        _local.inside = False
    for watcher in tuple(WATCHERS):
        watcher(router, query, key, value, attn_mask, options.get("is_causal", False), options.get("scale"), output)
    return output


@contextlib.contextmanager
def watching(watcher: Callable[..., None]) -> Iterator[None]:
    """Register ``watcher`` for the block."""
    WATCHERS.append(watcher)
    try:
        yield
    finally:
        WATCHERS.remove(watcher)
