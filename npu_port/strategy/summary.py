"""auto's one line per process: what it picked, over how many shape buckets, and whether any pick is provisional.

auto decides per shape bucket, and a model has tens of them. A line per bucket (what auto used to log for each
provisional entry it met) is noise a user cannot act on: the details belong in ``handle.explain()`` and
``npu-port run --verbose``, which show every candidate's times and why the winner won. What stays on the console is
one line, said once, when the process exits: only then are all its buckets known, so the line is complete (a line
at the first decision would miss the rest, a line per decision is the noise again). ``npu-port run`` takes the line
over (:meth:`ProcessSummary.claim`) and shows it in its own summary, or records :meth:`ProcessSummary.data` in its
report, so that nothing is said twice. A process whose auto routed nothing says nothing.

The line goes to the ``npu_port.strategy`` logger, as auto's cache warnings do, at WARNING so that it shows without
any logging set up.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import Counter
from typing import Any, Dict, Optional, Tuple

from .decision import Decision

logger = logging.getLogger("npu_port.strategy")

#: Where the line sends a user for the details.
DETAILS = "details: handle.explain() or npu-port run --verbose"


class ProcessSummary:
    """The picks of every auto (``select: measure``) router of this process, by strategy and bucket."""

    def __init__(self) -> None:
        self._picks: Dict[Tuple[str, str], Decision] = {}
        self._lock = threading.Lock()
        self._registered = False
        self.claimed = False

    def note(self, strategy: str, decision: Decision) -> None:
        """Record the decision a router keeps for a bucket (a later one for the same bucket replaces it)."""
        with self._lock:
            self._picks[(strategy, decision.bucket)] = decision
            if not self._registered:
                self._registered = True
                atexit.register(self.emit)

    def data(self) -> Dict[str, Any]:
        """Per strategy: the buckets, the kernels picked (how many buckets each), how many were measured, loaded
        from the disk cache, or are provisional. JSON-ready."""
        found: Dict[str, Any] = {}
        with self._lock:
            picks = list(self._picks.items())
        for (strategy, _), decision in picks:
            entry = found.setdefault(
                strategy, {"buckets": 0, "kernels": Counter(), "from_disk_cache": 0, "provisional": 0}
            )
            entry["buckets"] += 1
            entry["kernels"][decision.kernel] += 1
            entry["from_disk_cache"] += decision.source == "disk cache"
            entry["provisional"] += decision.provisional
        for entry in found.values():
            entry["kernels"] = dict(entry["kernels"].most_common())
            entry["measured"] = entry["buckets"] - entry["from_disk_cache"]
        return found

    def line(self) -> Optional[str]:
        """The summary line, or None when no auto router decided anything in this process."""
        parts = []
        for strategy, entry in self.data().items():
            buckets = entry["buckets"]
            kernels = ", ".join(f"{name} {count}" for name, count in entry["kernels"].items())
            provisional = entry["provisional"]
            if provisional:
                state = f"{provisional} provisional: the next runs measure {'it' if provisional == 1 else 'them'} more"
            else:
                state = "none provisional"
            text = (
                f"{buckets} shape bucket{'s' if buckets != 1 else ''} -> {kernels} ({entry['measured']} measured, "
                f"{entry['from_disk_cache']} from the disk cache; {state})"
            )
            parts.append(text if strategy == "auto" else f"strategy {strategy}: {text}")
        if not parts:
            return None
        return f"npu-port auto: {'; '.join(parts)}; {DETAILS}"

    def claim(self) -> Optional[str]:
        """The line, for a caller that shows it itself (``npu-port run``): nothing is logged at exit then."""
        self.claimed = True
        return self.line()

    def emit(self) -> None:
        """Log the line once (at exit), unless it was claimed or there is nothing to say."""
        if self.claimed:
            return
        self.claimed = True
        line = self.line()
        if line is not None:
            logger.warning("%s", line)

    def reset(self) -> None:
        """Forget every pick (and a claim): for tests, which run many programs' worth of auto in one process."""
        with self._lock:
            self._picks.clear()
            self.claimed = False


SUMMARY = ProcessSummary()
