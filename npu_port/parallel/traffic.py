"""How many bytes this process sent to the others, by collective: the measured side of the benchmark's "bytes
exchanged per step against the analytic figure" (benchmarks/parallel_scaling.py).

Counted where npu-port issues the collective (the context-parallel attention of :mod:`.sequence`, the mask exchange,
CFG's one exchange per step); diffusers' own gathers at a model's ``_cp_plan`` outputs are not ours and are added
analytically by the benchmark. The count is what one rank sends whatever the algorithm the library uses: for an
all-to-all of ``n`` bytes over ``k`` ranks, ``n * (k - 1) / k`` (its own share stays); for an all-gather of ``n``
bytes per rank, ``n * (k - 1)`` (every other rank needs its ``n`` bytes: sent directly or relayed round a ring, the
volume per rank is the same).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Dict


class Traffic:
    """A thread-safe tally of bytes sent per collective kind (``all_to_all``, ``all_gather``)."""

    def __init__(self) -> None:
        self._bytes: Counter = Counter()
        self._calls: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, kind: str, nbytes: float) -> None:
        with self._lock:
            self._bytes[kind] += int(nbytes)
            self._calls[kind] += 1

    def reset(self) -> None:
        with self._lock:
            self._bytes.clear()
            self._calls.clear()

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        """``{"bytes": {kind: n}, "calls": {kind: n}}`` so far."""
        with self._lock:
            return {"bytes": dict(self._bytes), "calls": dict(self._calls)}

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())


#: The process's one tally.
TRAFFIC = Traffic()
