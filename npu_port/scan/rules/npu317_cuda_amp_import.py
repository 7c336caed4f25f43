"""NPU317: an import of ``torch.cuda.amp``, deprecated everywhere (``torch.amp`` replaces it)."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule

MODULE = "torch.cuda.amp"


def _amp_module(name: Optional[str]) -> bool:
    """``torch.cuda.amp`` or one of its submodules (``torch.cuda.amp.grad_scaler``)."""
    return bool(name) and (name == MODULE or name.startswith(MODULE + "."))  # type: ignore[union-attr]


@register_rule
class CudaAmpImport(Rule):
    """``import torch.cuda.amp``, ``from torch.cuda.amp import autocast, GradScaler``, ``from torch.cuda import amp``.

    ``torch.cuda.amp`` is deprecated on every device (torch warns at each ``autocast`` / ``GradScaler`` made from
    it) and will go; its uses are CUDA-only as well, which NPU307 / NPU308 report where they are. Import from
    ``torch.amp`` instead and name the device: ``torch.amp.autocast(device_type)``, ``torch.amp.GradScaler(device)``,
    ``torch.amp.custom_fwd(device_type=...)``. The module or one of its names read as a value (``autocast =
    torch.cuda.amp.autocast``, a bare ``@torch.cuda.amp.custom_fwd``) is an import by another name: reported there.

    Example::

        from torch.cuda.amp import GradScaler, autocast  # NPU317
        autocast = torch.cuda.amp.autocast               # NPU317
    """

    code = "NPU317"
    name = "cuda-amp-import"
    message = "`torch.cuda.amp` is deprecated: import from `torch.amp` and pass the device type"
    severity = "deprecated"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("torch.cuda.amp", "cuda import")  # `import torch.cuda.amp`, `from torch.cuda import amp`

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Import, ast.ImportFrom):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    continue
                if _amp_module(node.module):
                    yield source.finding(self, node)  # the statement's first line names the module
                elif node.module == "torch.cuda":
                    for alias in node.names:
                        if alias.name == "amp":
                            yield source.finding(self, _placed(alias, node))
            else:
                for alias in node.names:  # type: ignore[attr-defined]
                    if _amp_module(alias.name):
                        yield source.finding(self, _placed(alias, node))
        for node in source.of(ast.Attribute):  # `autocast = torch.cuda.amp.autocast`: an import by another name
            parent = source.parents.get(node)
            if (
                not isinstance(node.ctx, ast.Load)  # type: ignore[attr-defined]
                or (isinstance(parent, ast.Call) and parent.func is node)  # a call: NPU307 / NPU308's
                or isinstance(parent, ast.Attribute)  # the outermost attribute only
            ):
                continue
            qualified = source.resolve(node)
            if _amp_module(qualified):
                yield source.finding(
                    self, node, f"`{qualified}` is deprecated and CUDA's: use `torch.amp` and pass the device type"
                )


def _placed(alias: ast.alias, statement: ast.stmt) -> ast.AST:
    """Where a finding about one name of an import goes: the name (Python 3.10 and later give it a position), else
    the statement."""
    return alias if getattr(alias, "lineno", None) is not None else statement
