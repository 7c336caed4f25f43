"""Helpers of the custom-CUDA-extension rules (NPU502, NPU503, NPU506): whether a ``sources`` expression names CUDA
files, however the project builds the list, and which names of a file are compiled CUDA extensions — loaded with
``torch.utils.cpp_extension.load`` or imported as one (``import corr_cuda``, ``from pkg import _C``).

Projects rarely write the sources inline: ``sources = [os.path.join(root, f"{n}.cu") for n in KERNELS]``, a list
built with ``+=`` / ``.append`` / ``.extend``, ``glob.glob(os.path.join(root, "*.cu"))``, a name assigned at module
level and read in a function. A name is followed to what the file assigns it where the name is bound (and, through
those values, to the names they read, a few levels deep): reading only the call's own arguments missed them.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from ..context import LOCAL, PythonFile
from ._imports import FALLBACK_HANDLER, KERNEL_PACKAGES, _looks_compiled, classified_imports, fallback_modules
from ._misc import CUDA_SUFFIXES

#: How many names deep a sources expression is followed (``sources = base + cuda``, ``cuda = [...]``: two).
_DEPTH = 4
#: Methods that add to a list in place.
_GROWERS = ("append", "extend", "insert", "__iadd__")


def names_cuda_source(source: PythonFile, node: ast.AST) -> bool:
    """Whether an expression — a sources list, one file name, an f-string, a ``glob`` pattern, or a name the file
    assigns (``=``, ``+=``, ``.append`` / ``.extend``) one of these where it is bound — names a ``.cu`` / ``.cuh``
    file."""
    return cuda_source_named(source, node) is not None


def cuda_source_named(
    source: PythonFile, node: ast.AST, _depth: int = 0, _seen: Optional[Set[int]] = None
) -> Optional[ast.Constant]:
    """The first ``.cu`` / ``.cuh`` file name an expression names, followed as :func:`names_cuda_source` says, or
    None."""
    seen = _seen if _seen is not None else set()
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str) and part.value.endswith(CUDA_SUFFIXES):
            return part
        if isinstance(part, ast.Name) and _depth < _DEPTH and id(part) not in seen:
            seen.add(id(part))
            for value in _values_of(source, part):
                if value is not node:
                    found = cuda_source_named(source, value, _depth + 1, seen)
                    if found is not None:
                        return found
    return None


#: Builders of extensions whose ``sources=`` other rules read (NPU501-NPU503): not a project's own build helper.
_KNOWN_BUILDERS = ("torch.", "setuptools.", "distutils.")


def helper_builds(source: PythonFile) -> List[Tuple[ast.Call, ast.Constant]]:
    """``(call, first .cu name)`` for each call that hands ``sources=`` naming CUDA files to a builder of the
    project's own (``custom_ops.get_plugin("bias_act", sources=["bias_act.cpp", "bias_act.cu"])``): it compiles
    them just in time, as ``torch.utils.cpp_extension.load`` would."""

    def collect() -> List[Tuple[ast.Call, ast.Constant]]:
        found = []
        for call, name in source.calls():
            if name and (name.startswith(_KNOWN_BUILDERS) or name.split(".")[-1].endswith("Extension")):
                continue
            given = next((k.value for k in call.keywords if k.arg == "sources"), None)
            named = cuda_source_named(source, given) if given is not None else None
            if named is not None:
                found.append((call, named))
        return found

    return source.cached("extensions.helper_builds", collect)


def from_parameter(source: PythonFile, node: ast.AST, _depth: int = 0) -> bool:
    """Whether an expression reads a parameter of the function it is in, directly or through names assigned from
    one (``sources``, ``digest = [join(d, s) for s in sources]``): a build helper that compiles what it is given."""
    for part in ast.walk(node):
        if not isinstance(part, ast.Name) or source.binding(part.id, part) != LOCAL:
            continue
        scope = source.binding_scope(part.id, part)
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = scope.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            if any(a.arg == part.id for a in every) and not any(True for _ in _values_of(source, part)):
                return True
        if _depth < _DEPTH and any(from_parameter(source, v, _depth + 1) for v in _values_of(source, part)):
            return True
    return False


def _values_of(source: PythonFile, name: ast.Name) -> Iterator[ast.AST]:
    """What the file gives ``name`` in the scope that binds it where it is read: assigned values and what is added
    to it in place."""
    scope = source.binding_scope(name.id, name)
    if scope is None or source.binding(name.id, name) != LOCAL:
        return
    for value, where in _growth(source).get(name.id, ()):
        if source.scope_of(where) is scope:
            yield value


def _growth(source: PythonFile) -> Dict[str, List[Tuple[ast.AST, ast.AST]]]:
    """``{name: [(value, statement)]}``: every value the file assigns a plain name or adds to it in place, once per
    file."""

    def collect() -> Dict[str, List[Tuple[ast.AST, ast.AST]]]:
        found: Dict[str, List[Tuple[ast.AST, ast.AST]]] = {}
        for node in source.of(ast.Assign, ast.AugAssign, ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and node.value is not None:
                    found.setdefault(target.id, []).append((node.value, node))
        for call, _ in source.calls():
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in _GROWERS and isinstance(func.value, ast.Name):
                for argument in call.args:
                    found.setdefault(func.value.id, []).append((argument, call))
        return found

    return source.cached("extensions.growth", collect)


# ---- compiled extensions --------------------------------------------------------------------------------------------


def imported_extensions(source: PythonFile) -> FrozenSet[str]:
    """The qualified names of the compiled CUDA extensions the file imports, as NPU104-NPU106 classify them
    (``corr_cuda``, ``diff_gaussian_rasterization._C``), and of the CUDA kernel packages it imports
    (``liger_kernel``: ``KERNEL_PACKAGES``), and those npu-port's own fallbacks serve (``alt_cuda_corr``): a call
    whose qualified name is under one calls into it."""

    def collect() -> FrozenSet[str]:
        roots = set()
        for found, kind in classified_imports(source):
            if kind is not None and kind.kind == "handled" and kind.by == FALLBACK_HANDLER:
                roots.add(found.module.split(".")[0])
                continue
            if kind is None or kind.kind != "cuda-only":
                continue
            parts = found.module.split(".") + ([found.name] if found.name in ("_C", "_ext") else [])
            if parts[0] in KERNEL_PACKAGES:
                roots.add(parts[0])
                continue
            if "compiled CUDA extension" not in kind.why:
                continue
            end = next((i for i, part in enumerate(parts) if _looks_compiled(part)), len(parts) - 1)
            roots.add(".".join(parts[: end + 1]))
        return frozenset(roots)

    return source.cached("extensions.imported", collect)


def served_by_fallback(root: str) -> bool:
    """Whether npu-port ships a PyTorch fallback for the extension ``root`` (served under ``npu-port run``)."""
    return root.split(".")[0] in fallback_modules()


def extension_root(source: PythonFile, qualified: Optional[str]) -> Optional[str]:
    """The imported compiled extension a call's qualified name is under (``corr_cuda`` for
    ``corr_cuda.forward``), or None."""
    if not qualified:
        return None
    roots = imported_extensions(source)
    if not roots:
        return None
    parts = qualified.split(".")
    for end in range(len(parts) - 1, 0, -1):
        root = ".".join(parts[:end])
        if root in roots:
            return root
    return None
