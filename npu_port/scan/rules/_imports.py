"""Shared helpers of the CUDA-only-imports family (NPU1xx): what an imported module is (served by a drop-in, by a
fallback, CUDA-only, or nothing of ours to say), every import a file makes (``import``, ``from ... import``,
``importlib.import_module("...")`` / ``__import__("...")`` with a constant name), and how it is guarded — including
``"dropin"``: a module a drop-in serves, imported after ``install_dropins()`` (the fallback ``npu-port fix`` writes).

What the drop-ins and fallbacks serve is read from npu-port itself (:data:`npu_port.dropins.install.DROP_INS`,
:data:`npu_port.fallbacks.registry.BUILTIN_FALLBACKS`, and the names each drop-in module defines, read with ``ast``
so that no torch is imported), so the scan and ``npu-port run`` cannot disagree.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

from ..context import PythonFile

#: The mechanism each handled library is served by, as ``handled_by`` names it.
DROPIN_HANDLER = {
    "flash_attn": "the flash_attn drop-in (npu-port run)",
    "xformers": "the xformers drop-in (npu-port run)",
}
FALLBACK_HANDLER = "npu-port run's compiled-extension fallback"

#: Packages that cannot be imported, or do nothing useful, without CUDA: why, and what to do instead.
CUDA_ONLY_PACKAGES: Dict[str, str] = {
    "flash_attn_interface": "FlashAttention 3 (`flash_attn_interface`) is Hopper-only and has no npu-port drop-in: "
    "import `flash_attn` (served by the drop-in) or call `npu_port.attention` instead",
    "flash_attn_3": "FlashAttention 3 is Hopper-only and has no npu-port drop-in: import `flash_attn` (served by "
    "the drop-in) or call `npu_port.attention` instead",
    "flash_attn_2_cuda": "`flash_attn_2_cuda` is flash-attn's compiled CUDA extension: import `flash_attn` (served by "
    "the drop-in) instead",
    "apex": "NVIDIA apex is built with CUDA kernels: use torch's own (torch.nn.LayerNorm, torch.optim.AdamW(fused="
    "...), torch.amp) or Ascend's apex port",
    "amp_C": "`amp_C` is apex's compiled CUDA extension: use torch's fused optimizers or torch.amp instead",
    "liger_kernel": "liger_kernel is Triton kernels for CUDA GPUs: keep the model's own modules (drop the liger "
    "patching) on NPU and CPU",
    "sageattention": "SageAttention is CUDA/Triton-only: call `npu_port.attention` (or SDPA) instead",
    "sageattn": "SageAttention is CUDA/Triton-only: call `npu_port.attention` (or SDPA) instead",
    "xfuser": "xDiT (xfuser) needs CUDA and NCCL: use diffusers' context-parallel plans with npu-port's strategies",
    "yunchang": "yunchang (USP / ring attention) calls flash-attn kernels: use diffusers' context-parallel plans "
    "with npu-port's strategies",
    "bitsandbytes": "bitsandbytes' 8-bit / 4-bit kernels are CUDA (older releases fail at import without CUDA): "
    "load the model unquantized, or quantize for the target another way",
    "transformer_engine": "Transformer Engine is NVIDIA-only: use the model's torch layers and torch.amp",
    "flashinfer": "FlashInfer is CUDA-only: call `npu_port.attention` (or SDPA) instead",
    "mamba_ssm": "mamba_ssm's selective-scan kernels are CUDA/Triton-only: use a pure-PyTorch selective scan",
    "causal_conv1d": "causal_conv1d is a CUDA kernel: use torch.nn.functional.conv1d with left padding",
    "tinycudann": "tiny-cuda-nn is CUDA-only: use a pure-PyTorch hash encoding and MLP",
    "nvdiffrast": "nvdiffrast is CUDA-only: use a PyTorch rasterizer that runs on the target",
    "sgl_kernel": "sgl_kernel (SGLang's kernels) is CUDA-only: keep the model's torch layers on NPU and CPU",
    "flex_block_attn": "flex_block_attn is a CUDA block-sparse attention kernel: call `npu_port.attention` (or SDPA) "
    "instead",
}

#: The CUDA-only packages that are kernels: a call into one is a call into CUDA code (NPU506), as with a compiled
#: extension. The others' calls are reported by their own rules (flash-attn's) or are set-up, not kernels (xfuser).
KERNEL_PACKAGES = frozenset(
    {"liger_kernel", "sageattention", "sageattn", "flashinfer", "mamba_ssm", "causal_conv1d", "sgl_kernel",
     "flex_block_attn", "tinycudann", "nvdiffrast"}
)  # fmt: skip

#: What a file importing a compiled extension contains (the rules' triggers): a ``*_cuda`` name, or a ``_C`` /
#: ``_ext`` module named on an import line (``import a._C``, ``from a._C import f``, ``from . import _C``, a
#: parenthesised list), or in a string (``importlib.import_module("a._C")``). ``._C`` alone is in every ``torch._C``
#: call, and made the scan parse most files of torch's tree for nothing.
EXTENSION_TRIGGERS = (
    "_cuda",
    re.compile(r"_(?:C|ext)[\"']"),
    re.compile(r"(?:import|from)[ \t][^\n#]*?(?<!torch\.)(?<!torch import )_(?:C|ext)\b"),  # torch's own _C: portable
    re.compile(r"\n[ \t]*\w*_(?:C|ext)[ \t]*[,)]"),  # a name in a parenthesised import list
)

#: Top-level packages whose ``_C`` / ``*_cuda`` modules are not CUDA-only extensions.
PORTABLE_TOPS = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchtext",
        "torch_npu",
        "torch_scatter",
        "torch_sparse",
        "torch_cluster",
        "triton",
        "numpy",
        "jax",
        "tensorflow",
        "npu_port",
    }  # fmt: skip
)


@dataclass(frozen=True)
class Kind:
    """What an import is to us: ``handled`` (``by`` names the mechanism) or ``cuda-only`` (``why`` says why)."""

    kind: str  # "handled" or "cuda-only"
    library: str  # the name to show: the module (and name) imported
    why: str = ""
    by: str = ""


@dataclass(frozen=True)
class Import:
    """One module (and, for ``from m import n``, the name) a file imports, at the node that imports it."""

    node: ast.AST
    module: str
    name: Optional[str] = None


# ---- what npu-port serves -------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def served_modules() -> Dict[str, Tuple[str, str]]:
    """``{module: (drop-in name, module of the stand-in)}`` for every module a drop-in serves."""
    from ...dropins.install import DROP_INS

    return {module: (drop.name, impl) for drop in DROP_INS for module, impl in drop.modules.items()}


@functools.lru_cache(maxsize=None)
def fallback_modules() -> FrozenSet[str]:
    from ...fallbacks.registry import BUILTIN_FALLBACKS

    return frozenset(BUILTIN_FALLBACKS)


@functools.lru_cache(maxsize=None)
def exported_names(impl: str) -> FrozenSet[str]:
    """The names a drop-in module defines at top level (read with ``ast``: importing it would import torch), and
    ``__version__`` for a drop-in's package itself: the drop-in finder sets it from the version it stands in for."""
    import importlib.util

    from ...dropins.install import DROP_INS

    spec = importlib.util.find_spec(impl)
    if spec is None or not spec.origin:
        return frozenset()
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if any(drop.version is not None and drop.modules.get(drop.name) == impl for drop in DROP_INS):
        names.add("__version__")
    return frozenset(names)


# ---- classifying -----------------------------------------------------------------------------------------------------


def _looks_compiled(part: str) -> bool:
    """``_C``, ``foo_C``, ``_ext``, or ``cuda`` as one word of a longer name (``corr_cuda``, ``alt_cuda_corr``)."""
    if part == "_C" or part.endswith("_C") and part[:-2].isidentifier() or part == "_ext":
        return True
    words = part.split("_")
    return len(words) > 1 and "cuda" in words


def classify(module: str, name: Optional[str] = None) -> Optional[Kind]:
    """What importing ``module`` (or ``name`` from it) means without CUDA; None when it is nothing of ours."""
    top = module.split(".")[0]
    served = served_modules()
    shown = f"{module}.{name}" if name else module
    if module in served:
        dropin, impl = served[module]
        if name is None or f"{module}.{name}" in served or name in exported_names(impl):
            return Kind("handled", shown, by=DROPIN_HANDLER.get(dropin, f"the {dropin} drop-in (npu-port run)"))
        return Kind("cuda-only", shown, why=f"npu-port's {dropin} drop-in has no `{name}`: it raises ImportError "
                    f"under npu-port run; use the drop-in's functions or `npu_port.attention`")  # fmt: skip
    if top in {d for d, _ in served.values()}:
        dropin = top
        offered = ", ".join(sorted(m for m, (d, _) in served.items() if d == dropin))
        return Kind("cuda-only", shown, why=f"`{module}` is CUDA-only and npu-port's {dropin} drop-in does not serve "
                    f"it (it serves {offered}): replace what it is used for")  # fmt: skip
    if top in fallback_modules():
        return Kind("handled", shown, by=FALLBACK_HANDLER)
    if top in CUDA_ONLY_PACKAGES:
        return Kind("cuda-only", shown, why=CUDA_ONLY_PACKAGES[top])
    if top in PORTABLE_TOPS:
        return None
    parts = module.split(".") + ([name] if name in ("_C", "_ext") else [])
    if any(_looks_compiled(part) for part in parts):
        return Kind("cuda-only", shown, why=f"`{shown}` looks like a compiled CUDA extension: port its kernels to "
                    "PyTorch and register the port as a fallback (`npu_port.fallbacks.register_fallback`)")  # fmt: skip
    return None


# ---- finding the imports --------------------------------------------------------------------------------------------


def _under_type_checking(source: PythonFile, node: ast.AST) -> bool:
    parent = source.parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If):
            test = parent.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                return True
        parent = source.parents.get(parent)
    return False


def imports(source: PythonFile) -> List[Import]:
    """Every absolute import of the file (relative ones are the project's own), except under ``TYPE_CHECKING``;
    computed once per file."""
    return source.cached("imports", lambda: list(_imports(source)))


def _imports(source: PythonFile) -> Iterator[Import]:
    for node in source.of(ast.Import, ast.ImportFrom, ast.Call):
        if isinstance(node, ast.Import):
            found: List[Import] = [Import(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                continue
            found = [Import(node, node.module, alias.name) for alias in node.names if alias.name != "*"]
            found = found or [Import(node, node.module)]
        elif isinstance(node, ast.Call) and _dynamic_import(source, node):
            found = [Import(node, node.args[0].value)]  # type: ignore[attr-defined]
        else:
            continue
        if found and not _under_type_checking(source, node):
            yield from found


def _dynamic_import(source: PythonFile, call: ast.Call) -> bool:
    """``importlib.import_module("xformers")`` or ``__import__("xformers")`` with a constant, absolute name."""
    if not (call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return False
    if call.args[0].value.startswith(".") or not call.args[0].value:
        return False
    if isinstance(call.func, ast.Name) and call.func.id == "__import__":
        return source.binding("__import__", call) is None
    return source.resolve(call) == "importlib.import_module"


def is_project_module(source: PythonFile, module: str, levels: int = 8) -> bool:
    """Whether ``module`` is the project's own: ``a/b.py`` or ``a/b/__init__.py`` next to the file or in a folder
    above it (a repository's own ``apex/`` or ``models/attn_cuda.py`` is not the CUDA package)."""
    relative = Path(*module.split("."))
    folder = Path(os.path.abspath(source.path)).parent
    for _ in range(levels):
        if (folder / relative.with_suffix(".py")).is_file() or (folder / relative / "__init__.py").is_file():
            return True
        if folder.parent == folder:
            break
        folder = folder.parent
    return False


def classified_imports(source: PythonFile) -> List[Tuple[Import, Kind]]:
    """Every import of the file that is handled or CUDA-only, each module once per import statement."""
    return source.cached("classified_imports", lambda: list(_classified(source)))


def _classified(source: PythonFile) -> Iterator[Tuple[Import, Kind]]:
    for found in imports(source):
        kind = classify(found.module, found.name)
        if kind is None:
            continue
        if is_project_module(source, found.module.split(".")[0]):
            continue
        yield found, kind


def where(source: PythonFile, node: ast.AST) -> str:
    """``"at module level"`` or ``"inside `f`"`` (the innermost function)."""
    parent = source.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return f"inside `{parent.name}`"
        if isinstance(parent, ast.Lambda):
            return "inside a lambda"
        parent = source.parents.get(parent)
    return "at module level"


#: What ``install_dropins`` resolves to (``npu_port.dropins`` re-exports it from ``.install``).
INSTALL_DROPINS = frozenset({"npu_port.dropins.install_dropins", "npu_port.dropins.install.install_dropins"})


def _dropin_of(kind: Kind) -> Optional[str]:
    """The drop-in (``"flash_attn"``, ``"xformers"``) serving an import of this kind, or None."""
    return next((dropin for dropin, by in DROPIN_HANDLER.items() if kind.kind == "handled" and kind.by == by), None)


def _install_calls(source: PythonFile) -> Dict[ast.AST, Optional[FrozenSet[str]]]:
    """Each statement ``install_dropins(...)`` of the file: the drop-ins it names (None: every one); once per file."""

    def find() -> Dict[ast.AST, Optional[FrozenSet[str]]]:
        found: Dict[ast.AST, Optional[FrozenSet[str]]] = {}
        for call, name in source.calls():
            statement = source.parents.get(call)
            if name in INSTALL_DROPINS and isinstance(statement, ast.Expr):
                named = frozenset(
                    a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                )
                found[statement] = named if call.args else None
        return found

    return source.cached("install_dropins_calls", find)


def _installed_before(source: PythonFile, node: ast.AST, dropin: str) -> bool:
    """Whether a statement ``install_dropins(...)`` registering ``dropin`` comes before ``node`` in its block or an
    enclosing one: from there on, importing what the drop-in serves succeeds."""
    installs = _install_calls(source)
    child, parent = node, source.parents.get(node)
    while installs and parent is not None:
        for _, block in ast.iter_fields(parent):
            if isinstance(block, list) and child in block:
                for statement in block[: block.index(child)]:
                    if statement in installs and (installs[statement] is None or dropin in installs[statement]):
                        return True
        child, parent = parent, source.parents.get(parent)
    return False


def guard(source: PythonFile, found: Import, kind: Kind) -> str:
    """How ``found`` is guarded (:meth:`PythonFile.guard`), or ``"dropin"``: a module a drop-in serves, imported after
    ``install_dropins()`` — the ``except`` branch ``npu-port fix`` writes, which succeeds wherever the ``try`` failed
    (no rule reports it: the import in the ``try`` is the finding, NPU106)."""
    dropin = _dropin_of(kind)
    if dropin is not None and _installed_before(source, found.node, dropin):
        return "dropin"
    return source.guard(found.node)


def guardable(source: PythonFile, node: ast.AST) -> bool:
    """Whether ``npu-port fix`` can put the import statement ``node`` in ``try`` with the drop-in as its fallback: an
    ``import`` / ``from ... import`` (not a dynamic import call) whose every import one drop-in serves (``from
    xformers.ops import fmha, SwiGLU`` also imports what no drop-in has: guarding it would only hide that)."""
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        return False
    kinds = [classify(found.module, found.name) for found in imports(source) if found.node is node]
    dropins = {_dropin_of(kind) if kind is not None else None for kind in kinds}
    return len(dropins) == 1 and None not in dropins


def import_findings(rule, source: PythonFile, accepts, message, fix=None) -> Iterator:
    """One finding of ``rule`` per import statement (or dynamic import call) with imports ``accepts(kind, guard)``
    takes; ``message(kinds, guard, place)`` words it (``place``: "at module level" or "inside `f`"); ``fix(node)``,
    when given, is the finding's fix kind."""
    grouped: Dict[ast.AST, Tuple[str, List[Kind]]] = {}
    for found, kind in classified_imports(source):
        guarded = guard(source, found, kind)
        if accepts(kind, guarded):
            kinds = grouped.setdefault(found.node, (guarded, []))[1]
            if kind not in kinds:
                kinds.append(kind)
    for node, (guarded, kinds) in grouped.items():
        text = message(kinds, guarded, where(source, node))
        yield source.finding(rule, node, text, fix=fix(node) if fix is not None else None, at=_alias(node, kinds))


def _alias(node: ast.AST, kinds: List[Kind]) -> Optional[ast.AST]:
    """The name of an import statement spread over lines that the first of ``kinds`` is (the line to report): in a
    ``from`` import, only when the name is what makes it ours (``from pkg import (utils,\n_C)``); a module that is
    ours by itself (``from flash_attn_interface import (\n_flash_attn_forward)``) is named on the first line."""
    if isinstance(node, ast.ImportFrom):
        if node.module is None or classify(node.module) is not None:
            return None
        return next((alias for alias in node.names if f"{node.module}.{alias.name}" == kinds[0].library), None)
    if isinstance(node, ast.Import):
        return next((alias for alias in node.names if alias.name == kinds[0].library), None)
    return None


def names(kinds: List[Kind]) -> str:
    return ", ".join(f"`{k.library}`" for k in kinds)
