"""NPU506: a call into a compiled CUDA extension — one the file imports, or one it loads with cpp_extension."""

from __future__ import annotations

import ast
from typing import Dict, Iterator, Optional, Set, Tuple

from ..context import LOCAL, PythonFile
from ..rule import Finding, Rule, register_rule
from ._extensions import extension_root, helper_builds, imported_extensions, served_by_fallback
from ._imports import EXTENSION_TRIGGERS, KERNEL_PACKAGES
from .npu502_cuda_extension_jit_import import LOADERS, compiles_cuda


@register_rule
class CudaExtensionCall(Rule):
    """A call into a compiled CUDA extension: a function of a module the file imports that NPU104-NPU106 know as
    one (``import corr_cuda`` then ``corr_cuda.forward(x)``; ``from diff_gaussian_rasterization import _C`` then
    ``_C.rasterize_gaussians(...)``), or of what ``torch.utils.cpp_extension.load`` built from CUDA sources (``ext =
    load("ext", sources=[... ".cu"])`` then ``ext.forward(x)``).

    Severity ``runtime``: the call raises wherever the extension could not be built or imported — a ``NameError``,
    an ``AttributeError`` on the ``None`` a guarded import left, or the build's own error at a lazy ``load``. Where
    the import is unguarded, the import is the first thing to break (NPU104, NPU502, reported there); the calls are
    still where the port's work is: each needs a PyTorch path on NPU and CPU (``npu_port.fallbacks.register_fallback``
    serves one for an imported module). A call behind a check — of CUDA or of the extension itself (``if _C is not
    None:``, ``if torch.cuda.is_available():``), or in a ``try`` with an ``except`` — is ``guarded``, the check
    named: the fallback is already beside it. A call into a kernel package imported in the same function is left to
    that import's finding (NPU105 / NPU106), which marks the path. A call into an extension npu-port ships a
    fallback for (``alt_cuda_corr``) is ``info``: ``npu-port run`` serves the module where it is imported (NPU103,
    ``handled``, which is what run counts), so the call has nothing left to do.

    Example::

        import corr_cuda                            # NPU104
        def correlate(a, b):
            return corr_cuda.forward(a, b)          # NPU506
    """

    code = "NPU506"
    name = "cuda-extension-call"
    message = (
        "calls into a compiled CUDA extension: it raises where the extension could not be built or imported; give "
        "it a PyTorch fallback"
    )
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cpp_extension", ".cu'", '.cu"', *EXTENSION_TRIGGERS, *KERNEL_PACKAGES)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        if not _loads(source) and not imported_extensions(source):
            return
        for call, qualified in source.calls():
            root = extension_root(source, qualified)
            if root is not None and root in KERNEL_PACKAGES and _imported_in_function(source, call):
                continue  # the lazy import just before it is reported (NPU105 / NPU106) and marks this path
            if root is not None:
                what, name = f"`{root}`", root.split(".")[-1]
                if root in KERNEL_PACKAGES:
                    what = f"`{root}`'s kernels"
            else:
                loaded = _loaded_name(source, call)
                if loaded is None:
                    continue
                name, loader = loaded
                what = f"`{name}` (built by {loader})"
            kind = "CUDA-only" if root in KERNEL_PACKAGES else "the compiled CUDA extension"
            text = f"`{ast.unparse(call.func)}()` calls into {kind} {what}"
            check = _check(source, call, name)
            if root is not None and served_by_fallback(root):
                served = f"{text}: npu-port run serves it with npu-port's PyTorch fallback (NPU103 on its import)"
                yield source.finding(self, call, served, severity="info")
            elif check is None:
                message = (
                    f"{text}: it raises where the extension could not be built or imported; give it a PyTorch fallback"
                )
                yield source.finding(self, call, message)
            else:
                yield source.finding(self, call, f"{text}, reached only {check}", severity="guarded")


def _loads(source: PythonFile) -> Dict[int, Dict[str, str]]:
    """``{id(scope): {name: loader}}``: the names the file binds a CUDA-compiling ``load`` / ``load_inline`` result
    to, by the scope binding them — the assignment's, or the module's for a name its function declares ``global``."""

    def collect() -> Dict[int, Dict[str, str]]:
        found: Dict[int, Dict[str, str]] = {}
        helpers = {id(call) for call, _ in helper_builds(source)}
        for call, name in source.calls():
            statement = source.parents.get(call)
            if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is not call:
                continue
            if id(call) in helpers:
                name = name or ast.unparse(call.func)
            elif name not in LOADERS or not compiles_cuda(source, call, name):
                continue
            scope = source.scope_of(statement)
            declared: Set[str] = set()
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                declared = {n for node in ast.walk(scope) if isinstance(node, ast.Global) for n in node.names}
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    where = source.tree if target.id in declared else scope
                    found.setdefault(id(where), {})[target.id] = name.rsplit(".", 1)[-1] + "()"
        return found

    return source.cached("extensions.loads", collect)


def _loaded_name(source: PythonFile, call: ast.Call) -> Optional[Tuple[str, str]]:
    """``(name, loader)`` when ``call`` is a method of a name (``ext`` in ``ext.forward(x)``) bound, where it is read,
    to a CUDA build the file loaded; else None."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    name = func.value.id
    if source.binding(name, func.value) != LOCAL:
        return None
    scope = source.binding_scope(name, func.value)
    loader = _loads(source).get(id(scope), {}).get(name) if scope is not None else None
    return (name, loader) if loader is not None else None


def _check(source: PythonFile, node: ast.AST, name: str) -> Optional[str]:
    """How ``node`` is reached only where the extension works — ``under `if <test>``` for a test that mentions CUDA
    or the extension's name, ``in a `try` with an `except``` — or None."""
    child, parent = node, source.parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and child is not parent.test:
            test = ast.unparse(parent.test)
            if "cuda" in test.lower() or _mentions(parent.test, name):
                return f"under `if {test}`"
        if isinstance(parent, ast.Try) and parent.handlers and any(child is s for s in parent.body):
            return "in a `try` with an `except`"
        child, parent = parent, source.parents.get(parent)
    return None


def _mentions(test: ast.AST, name: str) -> bool:
    return bool(name) and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(test))


def _imported_in_function(source: PythonFile, call: ast.Call) -> bool:
    """Whether the name a call starts from (``sageattn`` in ``sageattn(q, k, v)``) is bound in a function: imported
    lazily where it is used."""
    base = call.func
    while isinstance(base, ast.Attribute):
        base = base.value
    if not isinstance(base, ast.Name):
        return False
    scope = source.binding_scope(base.id, base)
    return isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
