"""NPU307: autocast for CUDA: ``torch.cuda.amp.autocast``, ``torch.autocast("cuda")``."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import (
    AUTOCAST,
    argument,
    guarded_finding,
    is_cuda_literal,
    literal_part,
    single_value,
    without_device,
)

#: ``torch.cuda.amp.autocast`` under the names it is imported by.
CUDA_AMP_AUTOCAST = ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast")
#: ``torch.cuda.amp.autocast``'s parameters in their positional order, and ``torch.autocast``'s after its device.
LEGACY = ("enabled", "dtype", "cache_enabled")
MODERN = ("dtype", "enabled", "cache_enabled")
#: Decorators that compile a function with TorchScript, which cannot call ``npu_port.device.autocast``.
SCRIPTED = ("torch.jit.script", "torch.jit.script_method")


@register_rule
class CudaAutocast(Rule):
    """Mixed precision asked of CUDA: ``torch.cuda.amp.autocast(...)`` (however imported or aliased, also as a
    decorator), ``torch.autocast("cuda")``, ``torch.autocast(device_type="cuda")``, ``torch.amp.autocast("cuda")``.

    Without CUDA, torch warns "CUDA is not available ... Disabling autocast" and the block runs in float32: slower
    and twice the memory on an NPU, and code that expects half-precision outputs may break. ``npu-port run``'s
    redirect makes it the target's autocast (keeping CUDA's float16 default). ``npu-port fix`` writes
    ``npu_port.device.autocast(...)``: ``torch.autocast`` for the detected device with the same dtype, enabled and
    cache flags — on CUDA the very ``torch.autocast("cuda", ...)`` call. ``torch.cuda.amp.autocast``'s arguments are
    named (its positional order, enabled / dtype / cache, is not torch.autocast's) and its own defaults written out
    (``dtype=torch.float16, cache_enabled=True``: ``torch.autocast`` would take the enclosing region's). A helper,
    not ``torch.autocast(npu_port.device.autocast_device_type(), ...)``, because that call breaks where this one
    does not: with no dtype it takes the CPU's bfloat16 where CUDA code meant float16, torch 2.1's CPU autocast
    raises on entering with float16, and mps has no autocast before torch 2.5. Left to fix by hand: a device other
    than a plain ``"cuda"`` (``"cuda" if ... else "cpu"``), arguments unpacked from ``*args`` (or ``**kwargs`` for
    ``torch.cuda.amp.autocast``, whose dtype default must be written), and functions compiled with
    ``@torch.jit.script``, which cannot call a Python helper. That is ``--target npu-port``; by default (torch >=
    2.6) ``fix`` writes torch's own ``torch.autocast(<device type>, ...)`` with NPU310's device expression and the
    same arguments (CUDA's autocast on CUDA; on a CPU, CPU autocast).

    Example::

        with torch.cuda.amp.autocast():  # NPU307 -> npu_port.device.autocast(dtype=torch.float16, cache_enabled=True)
            y = model(x)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):  # NPU307 -> npu_port.device.autocast(dtype=...)
            y = model(x)
    """

    code = "NPU307"
    name = "cuda-autocast"
    message = "autocast for CUDA is disabled (with a warning) elsewhere"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("autocast",)
    fix_imports = ("npu_port", "torch")  # torch: the dtype written out (``from torch.cuda.amp import autocast``)
    fix_replaces = (*CUDA_AMP_AUTOCAST, *AUTOCAST)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            at: ast.AST = call
            if qualified in CUDA_AMP_AUTOCAST:
                first = call.args[0] if call.args else None  # a string there would read as a device in rewrite()
                text = isinstance(first, ast.Constant) and isinstance(first.value, str)
                fixable = _plain_arguments(call, LEGACY, keywords=False) and not text
            elif qualified in AUTOCAST and is_cuda_literal(argument(call, 0, "device_type")):
                device = argument(call, 0, "device_type")
                at = literal_part(source, device)  # type: ignore[arg-type]
                plain = isinstance(device, ast.Constant) and device.value == "cuda"  # "cuda:0" is no device type
                fixable = plain and _plain_arguments(call, ("device_type", *MODERN), keywords=True)
            elif qualified is None and is_cuda_literal(argument(call, 0, "device_type")):
                chosen = _autocast_alias(source, call)  # `scope = autocast if amp else nullcontext; scope("cuda")`
                if chosen is None:
                    continue
                device = argument(call, 0, "device_type")
                at, fixable = literal_part(source, device), False  # type: ignore[arg-type]
            else:
                continue
            yield guarded_finding(
                source,
                self,
                call,
                "autocast for CUDA warns and runs disabled (float32) elsewhere: use `npu_port.device.autocast(...)`, "
                "torch.autocast for the detected device (npu-port run redirects it)",
                fix=None if fixable and not _scripted(source, call) else "manual",
                at=at,
            )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``torch.autocast("cuda", ...)`` -> ``npu_port.device.autocast(...)``, the same arguments less the device
        (the rest keep their order); ``torch.cuda.amp.autocast(...)`` -> the same, its arguments named, and its
        defaults written where it was given none. The check made both safe only with these shapes: a first
        positional ``"cuda"`` or a ``device_type=`` keyword tells the first from the second, whose first positional
        argument is ``enabled``."""
        import libcst as cst

        from ..targets import call_for, expression

        if not isinstance(node, cst.Call):
            return None
        func = cst.parse_expression(expression("autocast", self.target))
        equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        modern = without_device(node, "device_type")
        if modern is not None:
            return node.with_changes(func=func, args=call_for("autocast", self.target, modern))
        args = list(node.args)
        named = [
            arg.with_changes(keyword=cst.Name(LEGACY[index]), equal=equal) if arg.keyword is None else arg
            for index, arg in enumerate(args)
        ]
        given = {arg.keyword.value for arg in named}
        missing = [(name, value) for name, value in _LEGACY_DEFAULTS if name not in given]
        if missing:
            separator = args[0].comma if len(args) > 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            last = named[-1].comma if named else cst.MaybeSentinel.DEFAULT
            if named:
                named[-1] = named[-1].with_changes(comma=separator)
            for position, (name, value) in enumerate(missing):
                comma = last if position == len(missing) - 1 else separator
                named.append(cst.Arg(cst.parse_expression(value), keyword=cst.Name(name), equal=equal, comma=comma))
        return node.with_changes(func=func, args=call_for("autocast", self.target, named))


def _autocast_alias(source: PythonFile, call: ast.Call) -> Optional[ast.AST]:
    """The assignment's conditional that makes ``call``'s name torch's autocast on one branch (``precision_scope =
    autocast if opt.precision == "autocast" else nullcontext``: assigned once in its scope), or None."""
    if not isinstance(call.func, ast.Name):
        return None
    value = single_value(source, call.func)
    if not isinstance(value, ast.IfExp):
        return None
    branches = (value.body, value.orelse)
    return (
        value
        if any(source.resolve(b) in AUTOCAST for b in branches if isinstance(b, (ast.Name, ast.Attribute)))
        else None
    )


#: What ``torch.cuda.amp.autocast`` passes ``torch.autocast`` when it is given nothing.
_LEGACY_DEFAULTS = (("dtype", "torch.float16"), ("cache_enabled", "True"))


def _plain_arguments(call: ast.Call, names: tuple, keywords: bool) -> bool:
    """Whether ``call``'s arguments can be mapped by name: no more positional ones than ``names``, none unpacked
    (``**kwargs`` only where ``keywords``: the helper takes the same names), no keyword outside ``names``."""
    if len(call.args) > len(names) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    return all(k.arg in names if k.arg is not None else keywords for k in call.keywords)


def _scripted(source: PythonFile, node: ast.AST) -> bool:
    """Whether ``node`` is in a function decorated ``@torch.jit.script`` (TorchScript calls no Python helper)."""
    parent = source.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in parent.decorator_list:
                if source.resolve(decorator) in SCRIPTED:
                    return True
        parent = source.parents.get(parent)
    return False
