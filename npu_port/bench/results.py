"""The record of a bench run: one :class:`Cell` per (shape, strategy), and the machine it ran on.

Numbers from one machine mean little on another, so a report always carries the device's model name, the torch
(and torch_npu) versions, the CPU count and threads, and the date. Cells are plain data: the table, the CSV, the JSON
and the plot are all views of the same list, and a refused cell keeps its reason in the same place a timed cell keeps
its time — a refusal is a result, not a gap. A run stopped early (Ctrl-C) is still a report: ``partial`` is true,
``stopped_because`` says why, and ``measured_cells`` of ``planned_cells`` says how far it got.
"""

from __future__ import annotations

import datetime
import os
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Dict, List, Optional, Tuple

#: Cell outcomes: timed; the strategy cannot run on this machine; it refused this shape (kernel reasons or the
#: memory budget); it accepted the shape and then failed (an error, or NaN/inf in the output); the run was stopped
#: (Ctrl-C) while this cell was being timed — its times so far are kept, with no memory or parity figures.
OK, UNAVAILABLE, REFUSED, FAILED, INTERRUPTED = "ok", "unavailable", "refused", "failed", "interrupted"


@dataclass
class Cell:
    """One strategy on one shape."""

    shape: str
    strategy: str
    status: str
    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    kernel: Optional[str] = None  # what ran it (for auto: what it picked)
    median_s: Optional[float] = None
    min_s: Optional[float] = None
    runs: int = 0
    select_s: Optional[float] = None  # choosing the kernel: auto's probe, ~0 for fixed strategies
    peak_bytes: Optional[int] = None
    tflops: Optional[float] = None
    parity_max_abs_error: Optional[float] = None
    parity_tolerance: Optional[float] = None
    parity_ok: Optional[bool] = None
    note: str = ""  # why it was refused / unavailable / failed; for auto, what its probe measured
    decision: List[Dict[str, Any]] = field(default_factory=list)  # auto: every candidate's outcome

    @property
    def ok(self) -> bool:
        return self.status == OK

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _version(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def machine_info(device: Any) -> Dict[str, Any]:
    """What the numbers depend on besides the code: device model, software versions, cores, date."""
    import torch

    from .._version import __version__
    from ..device import device_name

    return {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "torch_npu": _version("torch-npu") or _version("torch_npu"),
        "npu_port": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # other work on the machine skews timings (on a 2-core CPU, one busy core can slow 2-thread ops 10x)
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


@dataclass
class BenchReport:
    """A whole run: its settings, the machine, the cells, and what was left out and why."""

    machine: Dict[str, Any]
    settings: Dict[str, Any]
    shapes: List[Dict[str, Any]]
    cells: List[Cell] = field(default_factory=list)
    skipped_shapes: List[Tuple[str, str]] = field(default_factory=list)
    skipped_strategies: List[Tuple[str, str]] = field(default_factory=list)
    planned_cells: int = 0  # strategies x shapes
    stopped_because: Optional[str] = None  # set when the run was stopped before every cell was measured

    @property
    def partial(self) -> bool:
        return self.stopped_because is not None

    @property
    def measured_cells(self) -> int:
        """Cells with a final outcome (timed, refused, unavailable, failed); interrupted ones are not counted."""
        return sum(1 for cell in self.cells if cell.status != INTERRUPTED)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "partial": self.partial,
            "measured_cells": self.measured_cells,
            "planned_cells": self.planned_cells,
            "stopped_because": self.stopped_because,
            "machine": self.machine,
            "settings": self.settings,
            "shapes": self.shapes,
            "skipped_shapes": [{"shape": n, "reason": r} for n, r in self.skipped_shapes],
            "skipped_strategies": [{"strategy": n, "reason": r} for n, r in self.skipped_strategies],
            "cells": [c.as_dict() for c in self.cells],
        }
