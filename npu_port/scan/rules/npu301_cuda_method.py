"""NPU301: ``.cuda()`` on a tensor or a module."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule


@register_rule
class CudaMethod(Rule):
    """``x.cuda()`` moves a tensor or a module to a CUDA device and raises where there is none.

    ``npu-port run`` redirects it to the target device. The safe fix is ``.to(npu_port.get_device())`` (the device
    npu-port detects: NPU, CUDA, XPU, MPS or CPU), with ``import npu_port`` added once.

    Example::

        model = Net().cuda()          # NPU301
        batch = batch.cuda(non_blocking=True)  # NPU301
    """

    code = "NPU301"
    name = "cuda-method"
    message = "`.cuda()` needs a CUDA device"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = (".cuda(",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in ast.walk(source.tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "cuda"
                and source.resolve(node.func.value) not in ("torch", "torch.cuda")  # torch.cuda is the module
            ):
                yield source.finding(self, node)
