"""Shared helpers of the NPU1xx attention-call rules: which calls are flash_attn's and xformers', what their
arguments are (positional or keyword), and what npu-port's xformers drop-in serves of what they name.

What the xformers drop-in serves is read from its own modules (the names they define, the attention-bias classes
with their methods), with ``ast`` so that no torch is imported: the scan and ``npu-port run`` cannot disagree."""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

from ..context import PythonFile
from ._device import single_value
from ._imports import exported_names, is_project_module, served_modules

#: flash_attn functions the drop-in serves -> the position of ``causal`` (``window_size`` follows it).
FLASH_CAUSAL_AT: Dict[str, Optional[int]] = {
    "flash_attn_func": 5,
    "flash_attn_qkvpacked_func": 3,
    "flash_attn_kvpacked_func": 4,
    "flash_attn_varlen_func": 9,
    "flash_attn_varlen_qkvpacked_func": 5,
    "flash_attn_varlen_kvpacked_func": 8,
    "flash_attn_with_kvcache": None,  # keywords only: its positional order changed between releases
}
FLASH_MODULES = ("flash_attn", "flash_attn.flash_attn_interface")
#: flash-attention's top-level packages: flash-attn 2 (the drop-in serves part of it) and FlashAttention 3's (not).
FLASH_TOPS = frozenset({"flash_attn", "flash_attn_interface", "flash_attn_3"})
#: What the drop-in defines only to refuse when called (DropInError): they must return the log-sum-exp.
FLASH_REFUSED = frozenset({"_wrapped_flash_attn_forward", "_wrapped_flash_attn_backward"})
FLASH_PADDING = "flash_attn.bert_padding"
#: Arguments the drop-in refuses (DropInError) unless they have this default value.
FLASH_UNSUPPORTED = {
    "alibi_slopes": None,
    "softcap": 0.0,
    "return_attn_probs": False,
    "return_softmax_lse": False,
    "block_table": None,
    "rotary_cos": None,
}
XFORMERS_ATTENTION = {
    f"{module}.{function}": function
    for module in ("xformers.ops", "xformers.ops.fmha")
    for function in ("memory_efficient_attention", "memory_efficient_attention_forward")
}
#: ``memory_efficient_attention(query, key, value, attn_bias, p, scale, *, op, output_dtype)``: positions.
XFORMERS_POSITIONS = {"attn_bias": 3, "p": 4, "scale": 5}
#: What each attention bias the drop-in serves means (tests/scan/test_imports.py: these are the drop-in's classes).
XFORMERS_BIASES = {
    "LowerTriangularMask": "causal, top-left (query i sees keys j <= i: SDPA's is_causal)",
    "LowerTriangularMaskWithTensorBias": "causal top-left plus an additive tensor",
    "LowerTriangularFromBottomRightMask": "causal, bottom-right (query i sees keys j <= i + Skv - Sq)",
    "LocalAttentionFromBottomRightMask": "a sliding window, bottom-right aligned",
    "BlockDiagonalMask": "packed sequences (batch 1), each attending to its own keys",
    "BlockDiagonalCausalMask": "packed sequences, each causal top-left",
    "BlockDiagonalCausalFromBottomRightMask": "packed sequences, each causal bottom-right",
}
XFORMERS_BIAS_MODULE = "xformers.ops.fmha.attn_bias"


def flash_calls(source: PythonFile) -> Iterator[Tuple[ast.Call, str]]:
    """``(call, function name)`` for every call of a flash_attn function the drop-in serves."""
    for call, name in flash_library_calls(source):
        if "." in name:
            module, function = name.rsplit(".", 1)
            if module in FLASH_MODULES and function in FLASH_CAUSAL_AT:
                yield call, function


def flash_library_calls(source: PythonFile) -> List[Tuple[ast.Call, str]]:
    """``(call, qualified name)`` for every call of something of flash-attention's (:data:`FLASH_TOPS`: through a
    module attribute, an alias, a private function), however imported; a project's own module of that name is not
    the library. Computed once per file."""

    def find() -> List[Tuple[ast.Call, str]]:
        own: Dict[str, bool] = {}
        found = []
        for call, name in source.calls():
            top = name.split(".", 1)[0] if name else ""
            if top in FLASH_TOPS:
                if top not in own:
                    own[top] = is_project_module(source, top)
                if not own[top]:
                    found.append((call, name))
        return found

    return source.cached("flash_library_calls", find)


def flash_missing(qualified: str) -> Optional[str]:
    """The leading part of ``qualified`` that npu-port's flash_attn drop-in does not serve: the package for
    FlashAttention 3's (``flash_attn_interface``), ``flash_attn.flash_attn_triton`` for
    ``flash_attn.flash_attn_triton.flash_attn_func``, the name itself for
    ``flash_attn.flash_attn_interface._flash_attn_forward``; None when the drop-in serves it."""
    top = qualified.split(".", 1)[0]
    return top if top != "flash_attn" else dropin_missing(qualified, "flash_attn")


def unpacked_into(source: PythonFile, call: ast.Call) -> Optional[int]:
    """How many names ``a, b, c = call(...)`` unpacks the result into; None when it is not unpacked, or with a star
    (``a, b, *_``). The drop-in's ``unpad_input`` returns five values, flash-attn < 2.6's four."""
    parent = source.parents.get(call)
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
        return None
    target = parent.targets[0]
    if not isinstance(target, (ast.Tuple, ast.List)) or any(isinstance(e, ast.Starred) for e in target.elts):
        return None
    return len(target.elts)


def argument(call: ast.Call, keyword: str, position: Optional[int] = None) -> Optional[ast.AST]:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    if (
        position is not None
        and position < len(call.args)
        and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1])
    ):
        return call.args[position]
    return None


def is_constant(node: Optional[ast.AST], value: object) -> bool:
    """Whether ``node`` is absent or the constant ``value`` (``(-1, -1)`` for a tuple of constants)."""
    if node is None:
        return True
    if isinstance(node, ast.Constant):
        return node.value == value and type(node.value) is not bool or node.value is value
    if isinstance(node, (ast.Tuple, ast.List)) and isinstance(value, tuple):
        items = [_number(e) for e in node.elts]
        return items == list(value)
    return False


def _number(node: ast.AST) -> object:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    return node.value if isinstance(node, ast.Constant) else node


# ---- xformers: what the drop-in serves -------------------------------------------------------------------------------


def xformers_calls(source: PythonFile) -> Iterator[Tuple[ast.Call, str]]:
    """``(call, qualified name)`` for every call of something under ``xformers.ops``, however imported."""
    for call, name in source.calls():
        if name and name.startswith("xformers.ops."):
            yield call, name


def xformers_missing(qualified: str) -> Optional[str]:
    """The leading part of ``qualified`` (``xformers.ops.fmha.cutlass.FwOp``) that npu-port's xformers drop-in does
    not define (``xformers.ops.fmha.cutlass``): under ``npu-port run`` looking it up raises AttributeError. None
    when the drop-in defines it, or when it is not under a module the drop-in serves."""
    return dropin_missing(qualified, "xformers")


def dropin_missing(qualified: str, dropin: str) -> Optional[str]:
    """:func:`xformers_missing` for the drop-in named ``dropin``: the first part of ``qualified`` below a module it
    serves that the module does not define."""
    parts = qualified.split(".")
    served = served_modules()
    for end in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:end])
        if module in served and served[module][0] == dropin:
            name = f"{module}.{parts[end]}"
            if name in served or parts[end] in exported_names(served[module][1]):
                return None
            return name
    return None


def xformers_lookup_missing(source: PythonFile, node: ast.AST) -> Optional[str]:
    """:func:`xformers_missing` for the name ``node`` (a ``Name`` / ``Attribute`` chain) spells: ``xops.fmha.cutlass``
    for ``xops.fmha.cutlass.FwOp`` (AttributeError at this lookup), ``xformers.ops.fmha.Inputs`` for ``Inputs``
    imported by name (the import raises ImportError first: :func:`imported_by_name`, and NPU104 / NPU106 report
    the import; the use is where the port has to change)."""
    return xformers_missing(source.resolve(node) or "")


def imported_by_name(source: PythonFile, node: ast.AST, missing: str) -> bool:
    """Whether the import that binds ``node``'s root name already names ``missing`` (``from xformers.ops.fmha import
    Inputs``): then it is the import that fails, not this lookup."""
    root = node
    while isinstance(root, ast.Attribute):
        root = root.value
    imported = source.binding(root.id, root) if isinstance(root, ast.Name) else None
    return imported is not None and (imported == missing or imported.startswith(missing + "."))


#: Where a name is only tested, or handed to another name (the resolver follows that one to its use): a stand-in of
#: a failed import (``Inputs = None``) is harmless there.
_TESTS = (ast.Compare, ast.BoolOp, ast.If, ast.IfExp, ast.While, ast.Assert)


def xformers_values(source: PythonFile) -> Iterator[Tuple[ast.AST, str]]:
    """``(node, missing)`` for each use of something under ``xformers`` the drop-in does not define that is no
    xformers call's function or argument (those are the call's): ``fmha.Context`` as a value, a base class, an
    annotation, an ``isinstance`` argument. A name imported by name (``Inputs``) counts where it is used, not where
    it is only tested (``if Inputs is not None``) or assigned to another name."""
    candidates = _xformers_names(source)
    for name in source.of(ast.Name) if candidates else ():
        if name.id not in candidates or not isinstance(name.ctx, ast.Load):  # type: ignore[attr-defined]
            continue
        bound = source.binding(name.id, name)  # type: ignore[attr-defined]
        if not (bound and bound.startswith("xformers")):
            continue
        node, parent = name, source.parents.get(name)
        while isinstance(parent, ast.Attribute) and parent.value is node:
            node, parent = parent, source.parents.get(parent)
        if isinstance(parent, ast.Call) and parent.func is node or _in_xformers_call(source, node):
            continue
        missing = xformers_lookup_missing(source, node)
        if missing is None:
            continue
        if imported_by_name(source, node, missing) and (
            isinstance(parent, _TESTS) or isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)
            or isinstance(parent, ast.Assign) and all(isinstance(t, ast.Name) for t in parent.targets)
        ):  # fmt: skip
            continue
        yield node, missing


def _xformers_names(source: PythonFile) -> FrozenSet[str]:
    """The names the file binds to something of xformers' (its imports, and names assigned from those): resolving
    only these keeps the walk over every name of a big file cheap."""
    names = set()
    for found in source.of(ast.Import):
        names |= {(a.asname or a.name).split(".")[0] for a in found.names if a.name.startswith("xformers")}  # type: ignore[attr-defined]
    for found in source.of(ast.ImportFrom):
        if (found.module or "").startswith("xformers") and not found.level:  # type: ignore[attr-defined]
            names |= {a.asname or a.name for a in found.names}  # type: ignore[attr-defined]
    if names:  # `ops = xformers.ops`, then `fmha = ops.fmha`: assignments in order, chains followed once
        for assign in source.of(ast.Assign):
            root = assign.value  # type: ignore[attr-defined]
            if root.__class__ is not ast.Attribute and root.__class__ is not ast.Name:
                continue
            while root.__class__ is ast.Attribute:
                root = root.value
            if root.__class__ is ast.Name and root.id in names:
                names |= {t.id for t in assign.targets if isinstance(t, ast.Name)}  # type: ignore[attr-defined]
    return frozenset(names)


def _in_xformers_call(source: PythonFile, node: ast.AST) -> bool:
    """Whether ``node`` is within the arguments of a call of something of xformers' (NPU112 / NPU113 read those)."""
    parent = source.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Call) and (source.resolve(parent) or "").startswith("xformers."):
            return True
        parent = source.parents.get(parent)
    return False


@dataclass(frozen=True)
class BiasClass:
    """One attention-bias class of the drop-in: its members (inherited ones included) and what each method returns
    (a class name of the module, ``"cls"`` for a classmethod, or None for anything else)."""

    members: FrozenSet[str]
    returns: Dict[str, Optional[str]]


@functools.lru_cache(maxsize=None)
def xformers_bias_classes() -> Dict[str, BiasClass]:
    """The drop-in's attention-bias classes (subclasses of its ``AttentionBias``), read from its source."""
    impl = served_modules().get(XFORMERS_BIAS_MODULE, ("", ""))[1]
    spec = importlib.util.find_spec(impl) if impl else None
    if spec is None or not spec.origin:
        return {}
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def bases(name: str) -> List[str]:
        found = [name]
        for base in classes[name].bases:
            if isinstance(base, ast.Name) and base.id in classes:
                found += bases(base.id)
        return found

    result = {}
    for name in classes:
        lineage = bases(name)
        if "AttentionBias" not in lineage or name == "AttentionBias":
            continue
        members, returns = set(), {}
        for owner in reversed(lineage):  # the base first: a subclass's definition wins
            for item in classes[owner].body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                    returns[item.name] = _returned(item, classes)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    members |= {t.id for t in targets if isinstance(t, ast.Name)}
        result[name] = BiasClass(frozenset(members), returns)
    return result


def _returned(function: ast.FunctionDef, classes: Dict[str, ast.ClassDef]) -> Optional[str]:
    """The class ``function`` returns, from its annotation (``-> "BlockDiagonalCausalMask"``); ``"cls"`` for a
    classmethod annotated with a class (it builds ``cls``); None for anything else (a tensor, a tuple)."""
    annotation = function.returns
    text = annotation.value if isinstance(annotation, ast.Constant) else getattr(annotation, "id", None)
    if not (isinstance(text, str) and text in classes):
        return None
    if any(isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list):
        return "cls"
    return text


@dataclass(frozen=True)
class Bias:
    """What an ``attn_bias`` argument is: a bias class the drop-in serves (``served``), a name it lacks
    (``missing``), or neither (None: a tensor, or something the scan cannot follow)."""

    served: Optional[str] = None
    missing: Optional[str] = None


def xformers_bias(source: PythonFile, node: Optional[ast.AST]) -> Bias:
    """Follow ``attn_bias`` (``LowerTriangularMask()``, ``BlockDiagonalMask.from_seqlens(s).make_causal()``,
    ``xops.fmha.BlockDiagonalPaddedKeysMask.from_seqlens(...)``, or a name assigned one of these once in its scope)
    to the drop-in's class it ends as, or to the part the drop-in lacks."""
    if isinstance(node, ast.Name):
        node = single_value(source, node) or node
    methods: List[str] = []
    base: Optional[str] = None
    current = node
    while current is not None and base is None:
        if isinstance(current, ast.Call):
            current = current.func
        elif isinstance(current, (ast.Attribute, ast.Name)):
            base = source.resolve(current)
            if base is None and isinstance(current, ast.Attribute):
                methods.append(current.attr)
                current = current.value
            elif base is None:
                return Bias()
        else:
            return Bias()
    if base is None or not base.startswith("xformers."):
        return Bias()
    if xformers_missing(base) is not None:
        return Bias(missing=xformers_lookup_missing(source, current))  # type: ignore[arg-type]
    classes = xformers_bias_classes()
    parts = base.split(".")
    at = next((i for i, part in enumerate(parts) if part in classes), None)
    if at is None:
        return Bias()
    name = parts[at]
    for method in parts[at + 1 :] + methods[::-1]:
        if method not in classes[name].members:
            return Bias(missing=f"{name}.{method}")
        returned = classes[name].returns.get(method)
        if returned is None:
            return Bias()  # a tensor (materialize) or a value the scan does not follow
        name = name if returned == "cls" else returned
    return Bias(served=name)


def xformers_refused(source: PythonFile, call: ast.Call) -> List[str]:
    """What of an xformers call the drop-in lacks, looked up in the call (:func:`xformers_lookup_missing`): the
    function itself, the ``attn_bias`` class or one of its methods, an ``op`` from a kernel module it does not serve
    (each an AttributeError under npu-port run). Empty when the call needs nothing the drop-in lacks, or when what
    it lacks was imported by name (the import fails first)."""
    if xformers_missing(source.resolve(call) or "") is not None:
        function = xformers_lookup_missing(source, call.func)
        return [function] if function is not None else []
    missing = []
    bias = xformers_bias(source, argument(call, "attn_bias", XFORMERS_POSITIONS["attn_bias"]))
    if bias.missing is not None:
        missing.append(bias.missing)
    op = argument(call, "op")
    for node in ast.walk(op) if op is not None else ():
        if isinstance(node, (ast.Attribute, ast.Name)):
            lacking = xformers_lookup_missing(source, node)
            if lacking is not None and lacking not in missing:
                missing.append(lacking)
    return missing
