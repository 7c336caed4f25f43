"""NPU113: an xformers call naming something npu-port's xformers drop-in does not define."""

from __future__ import annotations

import ast
from typing import Iterator, List, Set

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._attention_calls import xformers_calls, xformers_missing, xformers_refused, xformers_values
from ._imports import imports


@register_rule
class XformersUnsupported(Rule):
    """An xformers call that needs what the drop-in does not define: an ``attn_bias`` class it does not serve
    (``BlockDiagonalPaddedKeysMask``, ``BlockDiagonalCausalWithOffsetPaddedKeysMask``, the paged and gappy masks, or
    a method such as ``make_local_attention()``), an ``op=`` from a kernel module (``xops.fmha.cutlass.FwOp``,
    ``xops.fmha.flash.FwOp``), or another ``xformers.ops`` function (``memory_efficient_attention_partial``,
    ``merge_attentions``, ``swiglu``, ...) — or a use of such a name that is no call: xformers' private fmha API
    (``fmha.Inputs``, ``fmha.Context``, ``_memory_efficient_attention_forward_requires_grad``,
    ``_memory_efficient_attention_backward``) as a value, a base class or an annotation.

    Under ``npu-port run`` the lookup raises AttributeError (an unknown bias object reaching the drop-in raises
    DropInError): the drop-in refuses rather than compute something else. Rewrite the call with a bias the drop-in
    serves (NPU112 lists them), pass an additive float tensor, or call ``npu_port.attention`` with a mask. An import
    of such a name is NPU104 as well (the import fails first, with ImportError); its uses are reported here too,
    where the code has to change — except where the name is only tested (``if Inputs is not None``).

    Example::

        bias = xops.fmha.attn_bias.BlockDiagonalPaddedKeysMask.from_seqlens(q_len, kv_pad, kv_len)
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)  # NPU113
        out, ctx = fmha._memory_efficient_attention_forward_requires_grad(fmha.Inputs(q, k, v), op=None)  # NPU113
    """

    code = "NPU113"
    name = "xformers-unsupported"
    message = "xformers call or name npu-port's drop-in does not define: raises under npu-port run"
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("xformers",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        reported = set()
        for call, qualified in xformers_calls(source):  # in walk order: an outer call before the calls in it
            missing = xformers_refused(source, call)
            if missing and _within(source, call, reported):
                continue  # `mea(q, k, v, attn_bias=Padded.from_seqlens(...))`: the outer call's finding names it
            if missing:
                reported.add(call)
            if missing and xformers_missing(qualified) is not None:  # the function itself: private API, another op
                yield source.finding(self, call, _lacking(source, missing[0]))
            elif missing:
                shown = qualified.rsplit(".", 1)[-1]
                yield source.finding(
                    self,
                    call,
                    f"`{shown}` needs {', '.join(f'`{m}`' for m in missing)}, which npu-port's xformers drop-in does "
                    f"not define ({_error(source, missing)} under npu-port run): use a bias it serves "
                    "(NPU112), an additive float tensor, or npu_port.attention",
                )
        for node, missing in xformers_values(source):
            yield source.finding(self, node, _lacking(source, missing))


def _within(source: PythonFile, node: ast.AST, calls: Set[ast.AST]) -> bool:
    parent = source.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        if parent in calls:
            return True
        parent = source.parents.get(parent)
    return False


def _lacking(source: PythonFile, missing: str) -> str:
    return (
        f"`{missing}` is not defined by npu-port's xformers drop-in ({_error(source, [missing])} under npu-port "
        "run): use memory_efficient_attention (served) or npu_port.attention instead"
    )


def _error(source: PythonFile, missing: List[str]) -> str:
    """What raises: the file's import, where it names a missing part (``from xformers.ops.fmha import Inputs``);
    else the lookup."""
    named = {f"{found.module}.{found.name}" for found in imports(source) if found.name}
    if any(m in named or any(m.startswith(n + ".") for n in named) for m in missing):
        return "its import raises ImportError"
    return "AttributeError"
