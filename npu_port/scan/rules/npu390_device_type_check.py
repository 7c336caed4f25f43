"""NPU390: a device-type check that expects CUDA (``x.device.type == "cuda"``, ``t.is_cuda``).

The matchers here are the one definition of such a check: the scan reports them, and ``npu-port run`` rewrites
exactly these in a project's own modules as they are imported (:mod:`npu_port.runtime.device_checks`). A device
held in a variable compared with ``"cuda"`` (``device == "cuda"``, :func:`device_name_side`) is reported too, but
not rewritten: the variable may hold a string the project chose itself.
"""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import is_device_name

CUDA = "cuda"


def mentions_cuda(node: ast.AST) -> bool:
    """``"cuda"``, or a tuple / list / set literal holding it."""
    if isinstance(node, ast.Constant):
        return node.value == CUDA
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value == CUDA for e in node.elts)
    return False


def is_type_read(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "type" and isinstance(node.ctx, ast.Load)


def cuda_type_side(node: ast.Compare) -> Optional[str]:
    """Which side of a comparison is the ``.type`` read compared with ``"cuda"``: ``"left"``, ``"right"`` or None.
    ``==``, ``!=``, ``in``, ``not in`` (the ``.type`` on the left for the last two)."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
        return None
    left, right = node.left, node.comparators[0]
    if is_type_read(left) and mentions_cuda(right):
        return "left"
    if isinstance(node.ops[0], (ast.Eq, ast.NotEq)) and is_type_read(right) and mentions_cuda(left):
        return "right"
    return None


def device_name_side(node: ast.Compare) -> Optional[str]:
    """Which side of ``device == "cuda"`` / ``self.device != "cuda"`` is the device (a name or attribute named like
    one, :func:`is_device_name`): ``"left"``, ``"right"`` or None. Not one of the checks npu-port run rewrites."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
        return None
    left, right = node.left, node.comparators[0]
    for side, device, other in (("left", left, right), ("right", right, left)):
        name = device.id if isinstance(device, ast.Name) else device.attr if isinstance(device, ast.Attribute) else ""
        if name and is_device_name(name) and isinstance(other, ast.Constant) and other.value == CUDA:
            return side
    return None


def is_cuda_read(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "is_cuda" and isinstance(node.ctx, ast.Load)


@register_rule
class DeviceTypeCheck(Rule):
    """A check that a tensor or device is CUDA: ``assert q.device.type == "cuda"``, ``if x.device.type != "cuda":``,
    ``device.type in ("cuda", "xpu")``, ``t.is_cuda``.

    Projects guard their fast paths (flash_attn, xformers, ``torch.cuda`` calls) with these; on an NPU or a CPU the
    assertion fails and the branch takes a path the project never took on CUDA. ``npu-port run`` rewrites exactly these
    checks in the project's own modules as they are imported, so the target device reads as CUDA there (nothing else
    changes, line numbers included). Without npu-port: compare with the device the project runs on instead.

    A variable or attribute named like a device compared with ``"cuda"`` (``if device == "cuda":``, ``if
    self._execution_device == "cuda":``) is reported as ``runtime``: npu-port run does not rewrite it, and on the
    target the CUDA branch (a ``set_device``, an ``empty_cache``) is skipped.

    Example::

        assert q.device.type == "cuda"          # NPU390
        if not x.is_cuda: x = x.cuda()          # NPU390 (and NPU301)
        if device == "cuda": torch.cuda.empty_cache()  # NPU390 (runtime)
    """

    code = "NPU390"
    name = "device-type-check"
    message = "a device-type check that expects CUDA fails or takes another path on the target"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"
    handled_by = "npu-port run (device-type checks in the project's own modules)"
    triggers = ("is_cuda", '"cuda"', "'cuda'")  # a comparison with the literal, or an is_cuda read

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Compare, ast.Attribute):
            if isinstance(node, ast.Compare) and cuda_type_side(node) is not None:
                yield source.finding(self, node)
            elif is_cuda_read(node) and not isinstance(source.parents.get(node), ast.FormattedValue):
                yield source.finding(self, node, "`.is_cuda` is False on the target device")  # not in a message
            elif isinstance(node, ast.Compare) and device_name_side(node) is not None:
                yield source.finding(
                    self,
                    node,
                    'a device compared with `"cuda"` is not equal to the target\'s (`npu`, `cpu`): the CUDA branch '
                    "is skipped there; compare with the device the project runs on",
                    severity="runtime",  # npu-port run rewrites `.type` checks only
                )
