"""NPU301: ``.cuda()`` on a tensor or a module."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import guarded_finding

#: Methods giving a storage, whose ``.cuda()`` has no ``.to(device)`` equivalent.
STORAGES = ("untyped_storage", "storage", "_typed_storage")


@register_rule
class CudaMethod(Rule):
    """``x.cuda()`` moves a tensor or a module to a CUDA device and raises where there is none.

    ``npu-port run`` redirects it to the target device. The safe fix is ``.to(npu_port.get_device().type)``: the
    type of the device npu-port detects (``"npu"``, ``"cuda"``, ``"xpu"``, ``"mps"`` or ``"cpu"``), so on CUDA it
    is ``.to("cuda")`` — the *current* device, exactly what ``.cuda()`` means after ``torch.cuda.set_device(rank)`` —
    with ``import npu_port`` added once — under ``npu-port fix --target npu-port``. By default (torch >= 2.6) it
    writes torch's own ``.to((torch.accelerator.current_accelerator() if torch.accelerator.is_available() else
    torch.device("cpu")).type)``: the same ``"cuda"`` on CUDA, ``"npu"`` with torch_npu, and ``"cpu"`` on a machine
    with no accelerator, where ``.cuda()`` raised (see :mod:`npu_port.scan.targets`).

    Example::

        model = Net().cuda()                   # NPU301, fixed to Net().to(npu_port.get_device().type)
        batch = batch.cuda(non_blocking=True)  # NPU301, fixed keeping non_blocking
        x = x.cuda(local_rank)                 # NPU301, a manual fix: which device is the project's choice
    """

    code = "NPU301"
    name = "cuda-method"
    message = "`.cuda()` needs a CUDA device"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = (".cuda(",)
    fix_imports = ("npu_port",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Call):
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "cuda"
                and source.resolve(node.func.value) not in ("torch", "torch.cuda")  # torch.cuda is the module
            ):
                receiver = node.func.value
                if _self_method(source, node):
                    continue  # `self.cuda()` in a class that defines (or inherits in this file) its own `cuda()`
                if (
                    isinstance(receiver, ast.Call)
                    and isinstance(receiver.func, ast.Attribute)
                    and (receiver.func.attr in STORAGES)
                ):  # a storage's .cuda(): its .to() takes no device
                    yield guarded_finding(
                        source,
                        self,
                        node,
                        "`storage.cuda()` raises without CUDA and npu-port run does not redirect it: move the tensor "
                        "instead",
                        fix="manual",
                        severity="runtime",
                    )
                elif node.args or any(k.arg in ("device", None) for k in node.keywords):  # a device index or **kw
                    yield guarded_finding(
                        source,
                        self,
                        node,
                        "`.cuda(device)` needs a CUDA device; move to the device the project picks for this rank "
                        "(e.g. `.to(f'{npu_port.get_device().type}:{index}')`)",
                        fix="manual",
                    )
                elif _own_cuda_method(source):
                    yield guarded_finding(
                        source,
                        self,
                        node,
                        "`.cuda()` needs a CUDA device; this file defines a `cuda()` method of its own, so the "
                        "receiver may be one of its objects (whose `.to()` may not exist): change it by hand",
                        fix="manual",
                    )
                else:
                    yield guarded_finding(source, self, node)

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``x.cuda(non_blocking=...)`` -> ``x.to(<device type>, non_blocking=...)``, the device type's expression
        the target's."""
        import libcst as cst

        from ..targets import expression

        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "cuda"):
            return None
        device = cst.Arg(cst.parse_expression(expression("device_type", self.target)))
        if node.args:
            device = device.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return node.with_changes(func=node.func.with_changes(attr=cst.Name("to")), args=[device, *node.args])


def _own_cuda_method(source: PythonFile) -> bool:
    """Whether the file defines a ``cuda`` method (a class of its own with ``def cuda(self)``): ``.cuda()`` may then
    be that method, not a tensor's or a module's, and rewriting it to ``.to(...)`` is not safe — the scan sees no
    receiver types. Once per file."""
    return source.cached(
        "own_cuda_method",
        lambda: any(
            isinstance(source.parents.get(node), ast.ClassDef) and node.name == "cuda"  # type: ignore[attr-defined]
            for node in source.of(ast.FunctionDef)
        ),
    )


def _self_method(source: PythonFile, call: ast.Call) -> bool:
    """``self.cuda()`` inside a method of a class that defines ``cuda`` itself or through a base class defined in
    the same file (``class Engine(BaseEngine)``): the class's own method, not a tensor's or a module's."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if not (isinstance(receiver, ast.Name) and receiver.id == "self"):
        return False
    node: Any = source.parents.get(call)
    while node is not None and not isinstance(node, ast.ClassDef):
        node = source.parents.get(node)
    classes = {c.name: c for c in source.of(ast.ClassDef)}  # type: ignore[attr-defined]
    seen: set = set()
    while isinstance(node, ast.ClassDef) and node.name not in seen:
        seen.add(node.name)
        if any(isinstance(item, ast.FunctionDef) and item.name == "cuda" for item in node.body):
            return True
        bases = [classes[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
        node = bases[0] if len(bases) == 1 else None
    return False
