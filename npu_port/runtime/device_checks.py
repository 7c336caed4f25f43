"""Device-type checks in a project's own code see the redirect target as CUDA-compatible.

CUDA projects guard their fast paths with ``assert q.device.type == "cuda"`` or ``if x.device.type == "cuda":``
before calling flash_attn, xformers or ``torch.cuda`` APIs. Under ``npu-port run`` the redirect moves every tensor to
the target (``npu`` or ``cpu``), so such an assertion fails on every device npu-port supports, and a branch takes a
path the project never took on CUDA — although the drop-ins and the redirect would serve the CUDA path. Patching
``torch.device.type`` globally would lie to torch and every library; instead the project's own modules (those
``npu-port run`` watches, and the entry script) are rewritten as they are imported, and only these comparisons:

* ``<expr>.type == "cuda"``, ``!=``, ``in ("cuda", ...)``, ``not in`` (either side) -> ``<expr>.type`` is passed
  through :meth:`DeviceChecks.type`, which answers ``"cuda"`` for the target's type and the value itself otherwise;
* ``<expr>.is_cuda`` reads -> :meth:`DeviceChecks.is_cuda`, True for a tensor on the target.

Which expressions these are is defined once, by the scan rule NPU390
(:mod:`npu_port.scan.rules.npu390_device_type_check`): ``npu-port scan`` reports exactly what ``npu-port run``
rewrites, and the run's report lists the rewrites under that code. The rule is imported only for a file that may
hold such a check (it says "cuda" and ".type" or "is_cuda"): importing it imports the whole scan package (about
30 ms, measured after torch), which a program without such a check should not pay at start-up.

Nothing else in the file changes: the rest of its code, its line numbers (tracebacks point at the user's lines) and
every other device string are left alone. Each rewrite is recorded — module, line, the source text — with how often
it answered "cuda" for the target, and ``npu-port run`` shows the list in its summary and report.

The rewrite is an :mod:`ast` transform compiled straight to bytecode at import time (no source is written, and no
``.pyc`` of a rewritten module is cached, so plain ``python`` later runs the file as written); source-to-source
rewrites that keep formatting are a different job (libcst, for ``npu-port fix``).
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from types import CodeType
from typing import Any, Dict, List, Optional, Tuple

from .handled import DEVICE_CHECK, DEVICE_CHECKS, RULES

#: The name the rewritten code calls; injected into each rewritten module's globals.
HELPER = "__npu_port_device_checks__"
#: The scan rule whose findings these rewrites handle (``npu-port run --report`` lists them under it).
RULE = RULES[DEVICE_CHECKS][DEVICE_CHECK]
#: The device type CUDA-written checks compare with.
CUDA = "cuda"


@dataclass
class Rewrite:
    """One rewritten expression: where it is, what it says, how often it answered "cuda" for the target, and the scan
    rule that finds it (NPU390)."""

    module: str
    filename: str
    line: int
    code: str
    hits: int = 0
    rule: str = RULE

    def as_dict(self) -> Dict[str, Any]:
        return {
            "rule": self.rule,
            "module": self.module,
            "file": self.filename,
            "line": self.line,
            "code": self.code,
            "hits": self.hits,
        }


class _Rewriter(ast.NodeTransformer):
    """Wraps the device-type reads of CUDA comparisons and every ``.is_cuda`` read in a call of the helper."""

    def __init__(self, checks: "DeviceChecks", module: str, filename: str, source: str) -> None:
        from ..scan.rules.npu390_device_type_check import cuda_type_side, is_cuda_read  # see the module docstring

        self.checks = checks
        self.module = module
        self.filename = filename
        self.source = source
        self.cuda_type_side = cuda_type_side
        self.is_cuda_read = is_cuda_read

    def _call(self, method: str, argument: ast.expr, shown: ast.expr) -> ast.Call:
        """``HELPER.method(argument, site)`` in place of ``shown``'s part; ``site`` indexes the record."""
        site = self.checks._record(self.module, self.filename, shown.lineno, ast.get_source_segment(self.source, shown))
        call = ast.Call(
            func=ast.Attribute(value=ast.Name(id=HELPER, ctx=ast.Load()), attr=method, ctx=ast.Load()),
            args=[argument, ast.Constant(site)],
            keywords=[],
        )
        return ast.copy_location(call, argument)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        side = self.cuda_type_side(node)
        if side == "left":
            node.left = self._call("type", node.left, node)
        elif side == "right":
            node.comparators = [self._call("type", node.comparators[0], node)]
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if self.is_cuda_read(node):
            return self._call("is_cuda", node.value, node)
        return node


class DeviceChecks:
    """The rewrite (:meth:`transform`) and what the rewritten code calls at run time, for one target device type.

    One instance per ``npu-port run``; :attr:`rewrites` is the record shown in the summary.
    """

    def __init__(self, target_type: str) -> None:
        self.target_type = target_type
        self.rewrites: List[Rewrite] = []
        #: False once npu-port run ends (``deactivate``): rewritten code already compiled keeps calling in, and from
        #: then on gets the plain values — as written, as if it had never been rewritten.
        self.active = True
        self._lock = threading.Lock()

    # ---- import time -------------------------------------------------------------------------------------------

    def _record(self, module: str, filename: str, line: int, code: Optional[str]) -> int:
        with self._lock:
            self.rewrites.append(Rewrite(module, filename, line, " ".join((code or "").split())))
            return len(self.rewrites) - 1

    def transform(self, source: str, filename: str, module: str) -> Optional[Tuple[CodeType, Dict[str, Any]]]:
        """The module's code with its device-type checks rewritten, and the globals it needs; None when it has none
        (the module then loads as usual, from its ``.pyc`` if there is one). A file that does not parse is left to
        the normal import, which reports the syntax error as Python would."""
        if CUDA not in source or (".type" not in source and "is_cuda" not in source) or self.target_type == CUDA:
            return None
        try:
            tree = ast.parse(source, filename)
        except (SyntaxError, ValueError):
            return None
        before = len(self.rewrites)
        tree = _Rewriter(self, module, filename, source).visit(tree)
        if len(self.rewrites) == before:
            return None
        ast.fix_missing_locations(tree)
        return compile(tree, filename, "exec", dont_inherit=True), {HELPER: self}

    # ---- run time ----------------------------------------------------------------------------------------------

    def type(self, value: Any, site: int) -> Any:
        """``device.type`` as CUDA-written code expects it: the target's type reads as ``"cuda"``."""
        if self.active and value == self.target_type:
            self.rewrites[site].hits += 1
            return CUDA
        return value

    def is_cuda(self, value: Any, site: int) -> Any:
        """``tensor.is_cuda``, True for a tensor on the target (``value`` is the object whose attribute is read)."""
        answer = value.is_cuda
        if (
            self.active
            and answer is False
            and getattr(getattr(value, "device", None), "type", None) == self.target_type
        ):
            self.rewrites[site].hits += 1
            return True
        return answer

    def deactivate(self) -> None:
        """Answer as written from now on (the compiled rewrites cannot be taken out of modules already imported)."""
        self.active = False

    def summary(self) -> List[Dict[str, Any]]:
        return [rewrite.as_dict() for rewrite in self.rewrites]
