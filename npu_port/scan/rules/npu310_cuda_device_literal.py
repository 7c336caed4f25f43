"""NPU310: ``"cuda"`` device literals in device positions."""

from __future__ import annotations

import ast
import re
from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import AUTOCAST, GENERATOR, GRAD_SCALER, argument, is_cuda_literal

_INDEXED = re.compile(r"cuda:\d+")


def _plain(node: ast.AST) -> bool:
    """A constant ``"cuda"`` or ``"cuda:N"``: what the safe fix rewrites (f-strings and arithmetic are manual)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "cuda" or _INDEXED.fullmatch(node.value) is not None)
    )


#: Keywords that take a device.
DEVICE_KEYWORDS = ("device", "map_location")
#: Calls reported by rules of their own (autocast, GradScaler, Generator, device meshes).
ELSEWHERE = AUTOCAST | GRAD_SCALER | GENERATOR | {"torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"}
#: Functions whose first argument is a device.
DEVICE_FIRST = ("torch.device", "torch.set_default_device", "torch.get_device_module")


def _device_name(name: str) -> bool:
    """A variable, attribute or parameter holding a device: ``device``, ``self.device``, ``vae_device``."""
    return name == "device" or name.endswith("_device")


def _target_name(target: ast.AST) -> Optional[str]:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


@register_rule
class CudaDeviceLiteral(Rule):
    """A CUDA device written as a string in a place that takes a device: ``device="cuda"`` (any call),
    ``.to("cuda")``, ``torch.device("cuda")``, ``torch.device("cuda", i)``, ``map_location="cuda:0"``,
    ``device = "cuda"`` / ``self.device = f"cuda:{rank}"``, a ``device="cuda"`` parameter default, an argparse
    ``--device`` option defaulting to ``"cuda"``; also ``"cuda:" + str(i)``, ``"cuda:{}".format(i)`` and
    ``"cuda" if ... else "cpu"``. The string ``"cuda"`` anywhere else (a log message, a dict key) is not reported.

    Tensors and modules sent there raise without CUDA ("Torch not compiled with CUDA enabled"). ``npu-port run``'s
    redirect maps these devices to the target in every place torch takes one; ``npu-port fix`` writes
    ``npu_port.get_device()`` (the CUDA device on CUDA).

    Example::

        x = torch.zeros(4, device="cuda")        # NPU310
        model.to(f"cuda:{local_rank}")           # NPU310
        device = torch.device("cuda", local_rank)  # NPU310
    """

    code = "NPU310"
    name = "cuda-device-literal"
    message = 'a `"cuda"` device literal: raises without CUDA'
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Call, ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda):
            literal = None
            if isinstance(node, ast.Call):
                literal = self._in_call(source, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(_device_name(_target_name(t) or "") for t in targets) and is_cuda_literal(node.value):
                    literal = node.value
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from self._in_defaults(source, node.args)
                continue
            if literal is not None:
                yield source.finding(
                    self,
                    literal,
                    "a CUDA device literal raises without CUDA: use `npu_port.get_device().type` "
                    "(npu-port run maps it to the target)",
                    fix=None if _plain(literal) else "manual",
                )

    def _in_call(self, source: PythonFile, call: ast.Call) -> Optional[ast.AST]:
        qualified = source.resolve(call)
        if qualified in ELSEWHERE:
            return None
        if qualified in DEVICE_FIRST:
            value = argument(call, 0, "type" if qualified == "torch.device" else "device")
            return value if is_cuda_literal(value) else None
        for name in DEVICE_KEYWORDS:
            for item in call.keywords:
                if item.arg == name and is_cuda_literal(item.value):
                    return item.value
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "to" and call.args:
            return call.args[0] if is_cuda_literal(call.args[0]) else None
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(_device_name(option.lstrip("-").replace("-", "_")) for option in options):
                for item in call.keywords:
                    if item.arg == "default" and is_cuda_literal(item.value):
                        return item.value
        return None

    def _in_defaults(self, source: PythonFile, arguments: ast.arguments) -> Iterator[Finding]:
        positional = arguments.posonlyargs + arguments.args
        pairs = list(zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults))
        pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
        for parameter, default in pairs:
            if _device_name(parameter.arg) and is_cuda_literal(default):
                yield source.finding(
                    self,
                    default,
                    "a CUDA device default raises without CUDA: default to None and use `npu_port.get_device()` "
                    "(npu-port run maps it to the target)",
                    fix="manual",  # a default is evaluated at import: the device must be looked up at call time
                )

    fix_imports = ("npu_port",)

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``"cuda"`` -> ``npu_port.get_device().type``; ``"cuda:1"`` -> ``f"{npu_port.get_device().type}:1"`` —
        strings still, equal to the originals on CUDA (comparisons, f-strings and ``torch.device(...)`` behave the
        same there)."""
        import libcst as cst

        if not isinstance(node, cst.SimpleString):
            return None
        text = node.evaluated_value
        if text == "cuda":
            return cst.parse_expression("npu_port.get_device().type")
        if _INDEXED.fullmatch(text):
            quote = node.quote  # the original's: valid where it stood (inside another f-string's braces, say)
            return cst.parse_expression(f"f{quote}{{npu_port.get_device().type}}:{text.split(':')[1]}{quote}")
        return None
