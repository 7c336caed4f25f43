"""NPU310: ``"cuda"`` device literals in device positions."""

from __future__ import annotations

import ast
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..context import LOCAL, PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import (
    AUTOCAST,
    GENERATOR,
    GRAD_SCALER,
    argument,
    guarded_finding,
    is_cuda_literal,
    is_device_name,
    literal_part,
    single_value,
)

_INDEXED = re.compile(r"cuda:\d+")
LITERAL = (
    "a CUDA device literal raises without CUDA: use `npu_port.get_device().type` (npu-port run maps it to the target)"
)
DICT_VALUE = (
    "a CUDA device as a dict value raises without CUDA where it is used as a device: use "
    "`npu_port.get_device().type` (npu-port run maps it to the target)"
)


def _plain(node: ast.AST) -> bool:
    """A constant ``"cuda"`` or ``"cuda:N"``: what the safe fix rewrites (f-strings and arithmetic are manual)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "cuda" or _INDEXED.fullmatch(node.value) is not None)
    )


#: Keywords that take a device besides those :func:`is_device_name` accepts.
DEVICE_KEYWORDS = ("map_location", "location")  # location: a checkpoint loader's (torch.load's map_location)
#: Calls reported by rules of their own (autocast, GradScaler, Generator, device meshes).
ELSEWHERE = AUTOCAST | GRAD_SCALER | GENERATOR | {"torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"}
#: Functions whose first argument is a device.
DEVICE_FIRST = ("torch.device", "torch.set_default_device", "torch.get_device_module")


def _literal(source: PythonFile, value: ast.AST) -> Optional[ast.AST]:
    """``value`` when it is a CUDA device literal, or the literal a name used there was assigned once (``DEVICE =
    "cuda"`` then ``.to(DEVICE)``: the finding, and the fix, go to the assignment)."""
    if is_cuda_literal(value):
        return value
    if isinstance(value, ast.Name):
        assigned = single_value(source, value)
        if assigned is not None and is_cuda_literal(assigned):
            return assigned
    return None


def _to_own_device_parameter(source: PythonFile, call: ast.Call, qualified: Optional[str]) -> List[ast.AST]:
    """The CUDA literals ``call`` passes by position to a device-named parameter of a function the file defines at
    module level (``def collate_fn(data, device)`` ... ``collate_fn(batch, "cuda:0")``): the keyword form is read
    with the other device keywords."""
    if qualified is not None or not isinstance(call.func, ast.Name) or not call.args:
        return []
    function = _own_functions(source).get(call.func.id)
    if function is None or source.binding(call.func.id, call) != LOCAL:
        return []
    parameters = function.args.posonlyargs + function.args.args
    found = []
    for parameter, value in zip(parameters, call.args):
        if isinstance(value, ast.Starred):
            break
        if is_device_name(parameter.arg) and is_cuda_literal(value):
            found.append(value)
    return found


def _own_functions(source: PythonFile) -> Dict[str, ast.AST]:
    """The functions the file defines at module level, by name (defined once); computed once per file."""

    def compute() -> Dict[str, ast.AST]:
        seen: Dict[str, List[ast.AST]] = {}
        for node in source.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seen.setdefault(node.name, []).append(node)
        return {name: nodes[0] for name, nodes in seen.items() if len(nodes) == 1}

    return source.cached("own_functions", compute)


def _function_name(source: PythonFile, node: ast.AST) -> str:
    """The name of the function ``node`` is in (``""`` at module level or in a lambda)."""
    parent = source.parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        parent = source.parents.get(parent)
    return parent.name if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""


def _target_name(target: ast.AST) -> Optional[str]:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


@register_rule
class CudaDeviceLiteral(Rule):
    """A CUDA device written as a string in a place that takes a device: ``device="cuda"`` and any keyword named
    ``*_device`` or ``device_map`` (any call), ``.to("cuda")``, ``torch.device("cuda")``, ``torch.device("cuda",
    i)``, ``map_location="cuda:0"``, a value of a dict there (``map_location={"cuda:0": "cuda:1"}``, ``device_map={"":
    "cuda:0"}``: the keys are kept), ``device = "cuda"`` / ``DEVICE = "cuda"`` / ``self.device = f"cuda:{rank}"``,
    a ``device="cuda"`` / ``device_map="cuda"`` parameter default, an argparse ``--device`` option defaulting to
    ``"cuda"``, a name of any spelling assigned ``"cuda"`` once and used in one of these places (reported where it
    is assigned), a dict's value anywhere (``{512: "cuda"}``, ``dict(unet="cuda:0")``: a table of devices), a
    ``return "cuda"`` in a function named like a device (``get_device``, ``default_device``), a checkpoint loader's
    ``location="cuda"``; also
    ``"cuda:" + str(i)``, ``"cuda:{}".format(i)`` and ``"cuda" if ... else "cpu"``. The string ``"cuda"`` anywhere else
    (a log message, a dict key) is not reported; the ``"cuda"`` of ``"cuda" if torch.cuda.is_available() else "cpu"``
    is chosen only where CUDA is: reported as ``guarded``, naming the test.

    Tensors and modules sent there raise without CUDA ("Torch not compiled with CUDA enabled"). ``npu-port run``'s
    redirect maps these devices to the target in every place torch takes one; ``npu-port fix`` writes
    ``npu_port.get_device().type`` for ``"cuda"`` and ``f"{npu_port.get_device().type}:1"`` for ``"cuda:1"`` (the same
    strings on CUDA) under ``--target npu-port``; by default (torch >= 2.6) torch's own
    ``(torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")).type``
    (and ``f"{...}:1"``): ``"cuda"`` on CUDA, ``"npu"`` with torch_npu, ``"cpu"`` where there is no accelerator (an
    index there stays: ``"cpu:1"`` is the CPU). A computed string or a parameter default is left to you.

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
        found: Dict[int, Tuple[ast.AST, str]] = {}  # a constant used as a device in several places: reported once
        for call, qualified in source.calls():
            for value in self._in_call(call, qualified):
                literal = _literal(source, value)
                if literal is not None:
                    found.setdefault(id(literal), (literal, LITERAL))
            for value in _to_own_device_parameter(source, call, qualified):  # collate(batch, "cuda:0")
                found.setdefault(id(value), (value, LITERAL))
            if qualified is None and isinstance(call.func, ast.Name) and call.func.id == "dict":  # dict(gpu="cuda")
                for item in call.keywords:
                    if item.arg is not None and is_cuda_literal(item.value):
                        found.setdefault(id(item.value), (item.value, DICT_VALUE))
        for node in source.of(
            ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Dict, ast.Return
        ):
            if isinstance(node, ast.Return):  # `def get_device(): ... return "cuda"`: the function answers a device
                if is_cuda_literal(node.value) and is_device_name(_function_name(source, node)):
                    found.setdefault(id(node.value), (node.value, LITERAL))
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(is_device_name(_target_name(t) or "") for t in targets) and is_cuda_literal(node.value):
                    found.setdefault(id(node.value), (node.value, LITERAL))
            elif isinstance(node, ast.Dict):  # {512: "cuda"}: a table of devices (the keys are tags: kept)
                for value in node.values:
                    if is_cuda_literal(value):
                        found.setdefault(id(value), (value, DICT_VALUE))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from self._in_defaults(source, node.args)
        for literal, message in sorted(found.values(), key=lambda n: (n[0].lineno, n[0].col_offset)):
            yield guarded_finding(
                source,
                self,
                literal,
                message,
                fix=None if _plain(literal) else "manual",
                at=literal_part(source, literal),
            )

    def _in_call(self, call: ast.Call, qualified: Optional[str]) -> List[ast.AST]:
        """The arguments of ``call`` (whose function is ``qualified``) in a device position."""
        if qualified in ELSEWHERE:
            return []
        if qualified in DEVICE_FIRST:
            value = argument(call, 0, "type" if qualified == "torch.device" else "device")
            return [value] if value is not None else []
        values = [k.value for k in call.keywords if k.arg and (k.arg in DEVICE_KEYWORDS or is_device_name(k.arg))]
        # a dict there maps names to devices (map_location={"cuda:0": "cuda:1"}, device_map={"": "cuda:0"}): its
        # values are devices; its keys are tags or module names, kept as written
        values += [item for value in values if isinstance(value, ast.Dict) for item in value.values]
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "to" and call.args:
            values.append(call.args[0])
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(is_device_name(option.lstrip("-").replace("-", "_")) for option in options):
                values += [k.value for k in call.keywords if k.arg == "default"]
        return values

    def _in_defaults(self, source: PythonFile, arguments: ast.arguments) -> Iterator[Finding]:
        positional = arguments.posonlyargs + arguments.args
        pairs = list(zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults))
        pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
        for parameter, default in pairs:
            if is_device_name(parameter.arg) and is_cuda_literal(default):
                yield guarded_finding(
                    source,
                    self,
                    default,
                    "a CUDA device default raises without CUDA: default to None and use `npu_port.get_device()` "
                    "(npu-port run maps it to the target)",
                    fix="manual",  # a default is evaluated at import: the device must be looked up at call time
                    at=literal_part(source, default),
                )

    fix_imports = ("npu_port",)

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``"cuda"`` -> the target's device type (``npu_port.get_device().type``); ``"cuda:1"`` ->
        ``f"{<device type>}:1"`` — strings still, equal to the originals on CUDA (comparisons, f-strings and
        ``torch.device(...)`` behave the same there)."""
        import libcst as cst

        from ..targets import expression

        if not isinstance(node, cst.SimpleString):
            return None
        text = node.evaluated_value
        device = expression("device_type", self.target)
        if text == "cuda":
            return cst.parse_expression(device)
        if _INDEXED.fullmatch(text):
            quote = node.quote  # the original's: valid where it stood (inside another f-string's braces, say)
            inner = "'" if quote.startswith('"') else '"'  # the device's own strings, in the other quote
            device = device.replace('"', inner)
            return cst.parse_expression(f"f{quote}{{{device}}}:{text.split(':')[1]}{quote}")
        return None
