"""Small reports built from hand-made records (no model run), for the text and plot tests."""

from __future__ import annotations

from typing import List

import torch

from npu_port.diff.compare import DiffReport, compare_records
from npu_port.diff.stats import tensor_stats


class Records:
    """Records of one side, in the order a run would write them."""

    def __init__(self) -> None:
        self.items: List[dict] = []

    def add(self, module: str, cls: str, io: str, values, step: int = 0, call: int = 0, kind: str = "module"):
        record = {"kind": kind, "module": module, "class": cls, "step": step, "call": call, "io": io, "index": 0}
        record.update(name="args[0]" if io == "in" else "out", device="cpu", seq=len(self.items), tensor=None)
        record.update(tensor_stats(torch.tensor(values, dtype=torch.float32)))
        self.items.append(record)
        return self


def two_module_report(b_last: float = 4.4, steps: int = 1) -> DiffReport:
    """``lin`` (B's output has ``b_last`` where A's has 4) then ``act`` carrying it, for each step."""
    a, b = Records(), Records()
    for step in range(steps):
        for side, last in ((a, 4.0), (b, b_last)):
            side.add("lin", "Linear", "in", [1.0, 1.0, 1.0, 1.0], step)
            side.add("lin", "Linear", "out", [1.0, 2.0, 3.0, last], step)
            side.add("act", "ReLU", "in", [1.0, 2.0, 3.0, last], step)
            side.add("act", "ReLU", "out", [1.0, 2.0, 3.0, last * (1 + step)], step)
    return compare_records(a.items, b.items)
