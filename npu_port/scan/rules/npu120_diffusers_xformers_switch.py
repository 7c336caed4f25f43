"""NPU120: diffusers' xformers switches."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule

_METHODS = ("enable_xformers_memory_efficient_attention", "set_use_memory_efficient_attention_xformers")
_FLAG = "_use_memory_efficient_attention_xformers"


@register_rule
class DiffusersXformersSwitch(Rule):
    """``pipe.enable_xformers_memory_efficient_attention()``, ``set_use_memory_efficient_attention_xformers(True)``
    or ``self._use_memory_efficient_attention_xformers = True`` (the flag of legacy attention classes).

    Without a working CUDA xformers, diffusers raises from these switches (xformers missing, or "torch.cuda is not
    available"), and a repository's own copies of the setter raise too. Under ``npu-port run`` the xformers hook
    routes them to npu-port's attention strategy instead. Outside it, drop the call: diffusers' default processors
    use SDPA. Inside a project's own setter, the flag set from the setter's parameter is not reported: the calls
    that switch it on are.

    Example::

        pipe.enable_xformers_memory_efficient_attention()        # NPU120
        unet.set_use_memory_efficient_attention_xformers(True)   # NPU120
    """

    code = "NPU120"
    name = "diffusers-xformers-switch"
    message = "diffusers' xformers switch: raises without a CUDA xformers"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = "npu-port run's xformers hook"
    triggers = ("memory_efficient_attention_xformers", "enable_xformers_memory_efficient_attention")

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Call, ast.Assign, ast.AnnAssign):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS:
                if node.func.attr == _METHODS[1] and node.args and _is_false(node.args[0]):
                    continue  # switching xformers off is harmless
                yield source.finding(
                    self, node, f"`{node.func.attr}()` raises without a CUDA xformers: npu-port run's xformers hook "
                    "routes it to npu-port's attention strategy; without npu-port, drop it (diffusers uses SDPA)"
                )  # fmt: skip
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and not _is_false(node.value):
                if _passes_parameter(source, node, node.value):
                    continue  # a switch of the project's own passing on its caller's choice: the call is reported
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == _FLAG for t in targets):
                    yield source.finding(
                        self, node, f"`{_FLAG}` switched on: the xformers path raises without a CUDA xformers; "
                        "npu-port run routes legacy attention classes to its strategy"
                    )  # fmt: skip


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, None)


def _passes_parameter(source: PythonFile, statement: ast.AST, value: ast.AST) -> bool:
    """Whether ``value`` is a parameter of the function the assignment is in (``def set_use_...(self, flag):
    self.attn._use_memory_efficient_attention_xformers = flag``)."""
    scope = source.scope_of(statement)
    if not isinstance(value, ast.Name) or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    arguments = scope.args
    return any(a.arg == value.id for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs])
