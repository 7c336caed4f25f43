"""NPU304: ``torch.cuda`` calls that raise without CUDA and that ``npu-port run``'s redirect answers."""

from __future__ import annotations

import ast
from typing import Iterator, Set

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import HELPERS, RAISES, REDIRECTED, call_text, classify, cuda_calls, guarded_finding

#: Reported by rules of their own.
ELSEWHERE = frozenset(("set_device",)) | frozenset(HELPERS)
#: Benign with ``None`` (a null context), CUDA-only with a stream.
STREAM_CONTEXTS = ("stream",)
#: Queries that answer without CUDA, but CUDA's (empty) figure: the NPU's memory and architecture go unreported.
QUERIES = {
    "memory_reserved": "0",
    "max_memory_reserved": "0",
    "memory_cached": "0",
    "max_memory_cached": "0",
    "memory_stats": "{}",
    "get_arch_list": "[]",
}
#: Classes CUDA-only as values too: ``isinstance(e, torch.cuda.Event)`` is False for the target's events, and the
#: class handed on is called later (``cls = torch.cuda.Stream``).
CLASSES = ("Event", "Stream")


@register_rule
class CudaApiRedirected(Rule):
    """A ``torch.cuda`` call that raises on a machine without CUDA — ``current_device()``, ``get_device_name()``,
    ``get_device_properties()``, ``Event()``, ``Stream()``, ``current_stream()``, ``torch.cuda.device(i)``,
    ``nvtx.range_push()``, ``get_rng_state()``, ``torch.cuda.FloatTensor``, ``with torch.cuda.stream(s):`` (with a
    stream: ``stream(None)`` is a null context) ... — that ``npu-port run``'s CUDA redirect answers for the target
    (events time with the host clock, properties describe the target). Also ``torch.cuda.Event`` / ``Stream`` used
    as values (``isinstance(e, torch.cuda.Event)``, ``stream_cls = torch.cuda.Stream``), not in annotations: an
    isinstance test is False for the target's events and streams, and the class is called later. Also the queries
    that answer without CUDA but say nothing of the target (``memory_reserved()``, ``max_memory_reserved()``,
    ``memory_stats()`` answer 0 / ``{}``; ``get_arch_list()`` ``[]``: ``info`` where npu-port run does not answer it).

    Outside ``npu-port run`` the line raises (an AssertionError "Torch not compiled with CUDA enabled" or a
    RuntimeError); to drop the dependency on the redirect, ask the target device instead (``npu_port.get_device()``,
    ``torch.npu`` on Ascend).

    Example::

        start = torch.cuda.Event(enable_timing=True)  # NPU304
        name = torch.cuda.get_device_name()            # NPU304
    """

    code = "NPU304"
    name = "cuda-api-redirected"
    message = "`torch.cuda` call raises without CUDA; npu-port run answers it"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            if name in STREAM_CONTEXTS and call.args and not _none(call.args[0]):
                yield guarded_finding(
                    source,
                    self,
                    call,
                    f"`torch.cuda.{name}(s)` with a stream is CUDA-only; npu-port run answers it for the target, "
                    f"elsewhere use the target's (`torch.get_device_module(device).{name}(s)`)",
                )
            elif name in QUERIES:
                yield guarded_finding(
                    source,
                    self,
                    call,
                    f"{call_text(name)} answers {QUERIES[name]} without CUDA, not the NPU's figure; "
                    + ("npu-port run answers it for the target, elsewhere ask " if name in REDIRECTED else "ask ")
                    + "the target's module (`torch.get_device_module(device)`)",
                    severity=None if name in REDIRECTED else "info",
                )
            elif classify(name) == RAISES and name in REDIRECTED and name not in ELSEWHERE:
                yield guarded_finding(
                    source,
                    self,
                    call,
                    f"{call_text(name)} raises without CUDA; npu-port run answers it for the target, "
                    "elsewhere ask npu_port.get_device()",
                )
        yield from self._classes(source)

    def _classes(self, source: PythonFile) -> Iterator[Finding]:
        """``torch.cuda.Event`` / ``Stream`` read as a value: not called, not in an annotation. A file that never
        writes either word is not walked (every name of a file is a lot of nodes)."""
        if not any(name in source.text for name in CLASSES):
            return
        names = _class_names(source)
        for node in [*source.of(ast.Attribute), *source.of(ast.Name)]:  # each list as the file keeps it
            if isinstance(node, ast.Attribute):
                if node.attr not in CLASSES:
                    continue
            elif node.id not in names:  # type: ignore[attr-defined]
                continue
            if not isinstance(node.ctx, ast.Load):  # type: ignore[attr-defined]
                continue
            parent = source.parents.get(node)
            if (isinstance(parent, ast.Call) and parent.func is node) or isinstance(parent, ast.Attribute):
                continue  # a call (reported above), or an attribute of the class (`torch.cuda.Event.elapsed_time`)
            qualified = source.resolve(node)
            if qualified not in ("torch.cuda.Event", "torch.cuda.Stream") or _annotation(source, node):
                continue
            name = qualified.rsplit(".", 1)[1]
            yield guarded_finding(
                source,
                self,
                node,
                f"`torch.cuda.{name}` as a value is CUDA's class: an isinstance test is False for the target's, and "
                f"calling it raises without CUDA; npu-port run answers it, elsewhere use `torch.{name}` or the "
                f"target's (`torch.get_device_module(device).{name}`)",
            )


def _none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _class_names(source: PythonFile) -> Set[str]:
    """The plain names under which the file may read ``torch.cuda.Event`` / ``Stream`` as imported (``from
    torch.cuda import Event as CudaEvent``); once per file. A name assigned the class (``cls = torch.cuda.Stream``) is
    reported where it is assigned, not where it is read."""

    def compute() -> Set[str]:
        found = set(CLASSES)
        for node in source.of(ast.ImportFrom):
            if node.module in ("torch.cuda", "torch.cuda.streams"):  # type: ignore[attr-defined]
                found |= {a.asname for a in node.names if a.asname and a.name in CLASSES}  # type: ignore[attr-defined]
        return found

    return source.cached("cuda_class_names", compute)


def _annotation(source: PythonFile, node: ast.AST) -> bool:
    """Whether ``node`` is (in) an annotation: a parameter's, a return's or an annotated assignment's."""
    child, parent = node, source.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.arg) and child is parent.annotation:
            return True
        if isinstance(parent, ast.arguments):
            return False  # a default
        child, parent = parent, source.parents.get(parent)
    if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and child is parent.returns:
        return True
    return isinstance(parent, ast.AnnAssign) and child is parent.annotation
