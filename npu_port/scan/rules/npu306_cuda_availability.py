"""NPU306: ``torch.cuda.is_available()`` / ``device_count()`` choose the device: False / 0 on an NPU."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import call_text, cuda_requirement, live_cuda_calls


@register_rule
class CudaAvailability(Rule):
    """``torch.cuda.is_available()`` and ``torch.cuda.device_count()`` answer False and 0 on an NPU machine.

    Nothing raises, but ``"cuda" if torch.cuda.is_available() else "cpu"`` quietly runs everything on the CPU.
    ``npu-port run`` keeps the answer honest; run it with ``--cuda-available`` to answer True (the work still goes to
    the NPU), or choose the device with ``npu_port.get_device()`` / count with ``npu_port.device.device_count()``.
    A test whose False answer stops the program (``assert torch.cuda.is_available()``, ``if not ...: raise``, a
    device count divided by) is NPU315; one inside code that runs only where CUDA is (the body of another such test)
    is not reported again.

    Example::

        device = "cuda" if torch.cuda.is_available() else "cpu"  # NPU306: cpu on an NPU machine
    """

    code = "NPU306"
    name = "cuda-availability"
    message = "`torch.cuda.is_available()` is False on an NPU: this branch picks the CPU"
    severity = "perf"
    targets = ("npu",)
    fix = "manual"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in live_cuda_calls(source):
            if name in ("is_available", "device_count") and cuda_requirement(source, call) is not None:
                continue  # NPU315's
            if _no_choice(source, call):
                continue
            if name == "is_available":
                yield source.finding(
                    self,
                    call,
                    f"{call_text(name)} is False on an NPU (the CPU branch runs): use npu_port.get_device(), or "
                    "npu-port run --cuda-available",
                )
            elif name == "device_count":
                yield source.finding(
                    self,
                    call,
                    f"{call_text(name)} is 0 on an NPU: use npu_port.device.device_count(), or npu-port run "
                    "--cuda-available",
                )


def _no_choice(source: PythonFile, call: ast.Call) -> bool:
    """The test of a conditional expression whose branches are the same (``"cpu" if torch.cuda.is_available() else
    "cpu"``): nothing depends on the answer."""
    parent = source.parents.get(call)
    return isinstance(parent, ast.IfExp) and parent.test is call and ast.dump(parent.body) == ast.dump(parent.orelse)
