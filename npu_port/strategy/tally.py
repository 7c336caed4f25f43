"""Every attention call a strategy routed while a tally is open, whatever applied the strategy: what ``npu-port run``
counts at the top level of its report.

A run's attention calls go through several routers: the process-wide strategy's (``npu_port.attention(kernel=None)``:
what the flash_attn / xformers drop-ins and patched legacy attention call) and one per strategy applied to a model or
pipeline — by the project (``set_attention_strategy(..., target=pipe)``) or for it (diffusers'
``enable_xformers_memory_efficient_attention()``, hooked). Each router counts its own calls (``router.calls``);
:func:`~npu_port.strategy.api.apply_router`, which every router is applied through, records it here with what applied
it (:meth:`Tally.via` names it; the default says process-wide or which target), so the run's count is one sum with no
path left out, and the summary can say through what each call ran.

Nothing is recorded unless a tally is open (``npu-port run`` opens one): a library user's strategies keep no router
alive. A restored handle's calls are folded into its route's total and its router dropped, so apply + restore cycles
leave nothing behind; at most :data:`LIVE` routers are held (beyond that the oldest is folded: a server applying per
request and never restoring).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

#: The most routers held at once (see the module docstring).
LIVE = 256
#: What applied the process-wide strategy (``npu_port.attention``, the drop-ins, patched legacy attention).
PROCESS_WIDE = "process-wide"

Route = Tuple[str, str]  # (what applied it, the strategy's name)


class Tally:
    """The routers applied while open, by route (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._depth = 0
        self._live: "collections.OrderedDict[int, Tuple[Route, Any]]" = collections.OrderedDict()  # id(router) ->
        self._folded: Dict[Route, collections.Counter] = {}  # insertion order: the order routes were first applied

    # ---- opening -----------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Start recording (nested opens share one record, started afresh by the outermost)."""
        with self._lock:
            if not self._depth:
                self._live.clear()
                self._folded.clear()
            self._depth += 1

    def close(self) -> None:
        """Stop recording; the outermost close forgets every router."""
        with self._lock:
            self._depth = max(0, self._depth - 1)
            if not self._depth:
                self._live.clear()
                self._folded.clear()

    # ---- recording ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def via(self, label: str) -> Iterator[None]:
        """Name what applies the strategies applied in this block, in this thread (the xformers hook's method)."""
        previous = getattr(self._local, "label", None)
        self._local.label = label
        try:
            yield
        finally:
            self._local.label = previous

    def record(self, router: Any, strategy: str, target: Any = None) -> None:
        """Count ``router``'s calls from now on, under what applies it: the :meth:`via` label, else process-wide or
        ``set_attention_strategy('name', target=Class)``."""
        if not self._depth:
            return
        label = getattr(self._local, "label", None)
        if label is None and target is not None:
            label = f"set_attention_strategy({strategy!r}, target={type(target).__name__})"
        label = label or PROCESS_WIDE
        with self._lock:
            if not self._depth:
                return
            route = (label, strategy)
            self._folded.setdefault(route, collections.Counter())
            self._live[id(router)] = (route, router)
            while len(self._live) > LIVE:
                self._fold(next(iter(self._live)))

    def fold(self, router: Any) -> None:
        """``router`` routes nothing more (its handle was restored): keep its count, drop it."""
        with self._lock:
            if self._live.get(id(router), (None, None))[1] is router:
                self._fold(id(router))

    def _fold(self, key: int) -> None:
        route, router = self._live.pop(key)
        self._folded[route].update(_calls(router))

    # ---- reading -----------------------------------------------------------------------------------------------

    def routes(self) -> List[Dict[str, Any]]:
        """``[{"via", "strategy", "calls": {kernel: n}}]`` per route, in the order each was first applied."""
        with self._lock:
            totals = {route: collections.Counter(folded) for route, folded in self._folded.items()}
            for route, router in self._live.values():
                totals[route].update(_calls(router))
        return [
            {"via": via, "strategy": strategy, "calls": dict(calls.most_common())}
            for (via, strategy), calls in totals.items()
        ]

    def calls(self) -> Dict[str, int]:
        """Every call routed, per kernel (most used first)."""
        total: collections.Counter = collections.Counter()
        for route in self.routes():
            total.update(route["calls"])
        return dict(total.most_common())


def _calls(router: Any) -> Dict[str, int]:
    calls: Optional[Dict[str, int]] = getattr(router, "calls", None)
    return dict(calls) if calls else {}


#: The one tally of this process.
TALLY = Tally()
