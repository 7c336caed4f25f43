"""Watchers of attention calls: who wants to see every call npu-port runs, with its inputs and output.

``npu_port.diff.capture`` records each call (its query, key, value, mask and output) next to the module it ran in, so
that a comparison of two runs can point at one attention call rather than at the module around it. The two entry
points report here: a strategy's router (``Router.__call__``: processors, targets) and ``npu_port.attention`` (the
process-wide strategy: drop-ins, patched legacy attention). Nothing is watched unless a watcher is registered: each
call's only cost is one test of an empty list.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, List

#: Registered watchers, called as ``watcher(runner, query, key, value, attn_mask, is_causal, scale, output)``
#: (``output`` is ``(out, lse)`` when the call asked for the log-sum-exp).
WATCHERS: List[Callable[..., None]] = []
_local = threading.local()


def inside() -> bool:
    """Whether this thread is already inside a watched call (the router calls itself once to run it)."""
    return getattr(_local, "inside", False)


def observe(runner: Any, query, key, value, attn_mask, **options: Any):
    """Run the call once through ``runner`` (the router, or ``npu_port.attention``) and show it to every watcher."""
    _local.inside = True
    try:
        output = runner(query, key, value, attn_mask, **options)
    finally:
        _local.inside = False
    for watcher in tuple(WATCHERS):
        watcher(runner, query, key, value, attn_mask, options.get("is_causal", False), options.get("scale"), output)
    return output


@contextlib.contextmanager
def watching(watcher: Callable[..., None]) -> Iterator[None]:
    """Register ``watcher`` for the block."""
    WATCHERS.append(watcher)
    try:
        yield
    finally:
        WATCHERS.remove(watcher)
