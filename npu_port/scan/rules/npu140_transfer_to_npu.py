"""NPU140: ``torch_npu.contrib.transfer_to_npu``."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import imports

_MODULE = "torch_npu.contrib.transfer_to_npu"


@register_rule
class TransferToNpu(Rule):
    """An import of ``torch_npu.contrib.transfer_to_npu``.

    Importing it patches torch process-wide and for good: every ``torch.cuda`` call, ``"cuda"`` string and ``.cuda()``
    goes to the NPU, ``torch.cuda.is_available()`` answers True on an NPU (so libraries pick CUDA-only paths), and
    nothing undoes it. Where torch_npu is not installed (a CPU, a GPU) the import fails. ``npu-port run`` does the same
    redirect reversibly, on any device, and reports what it changed: use it, and drop the import.

    Example::

        from torch_npu.contrib import transfer_to_npu  # NPU140
    """

    code = "NPU140"
    name = "transfer-to-npu"
    message = "transfer_to_npu patches torch globally and irreversibly: use npu-port run instead"
    severity = "info"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("transfer_to_npu",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        seen = set()
        for found in imports(source):
            full = f"{found.module}.{found.name}" if found.name else found.module
            if (full == _MODULE or full.startswith(_MODULE + ".")) and found.node not in seen:
                seen.add(found.node)
                guard = source.guard(found.node)
                fails = " and fails at import where torch_npu is missing" if guard == "unguarded" else ""
                yield source.finding(
                    self, found.node, f"transfer_to_npu patches torch globally and irreversibly{fails}: drop it "
                    "and launch with `npu-port run` (the same redirect, reversible, on any device)"
                )  # fmt: skip
