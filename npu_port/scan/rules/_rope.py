"""Shared helpers of the RoPE rules: which code is rotary-position-embedding code (by the names of the functions and
classes around it), and what in it builds float64 or complex tensors.

The scope is the point: float64 and complex tensors are fine in a spectrum or a loss, and the same calls are what
breaks on an NPU in the RoPE tables of HunyuanVideo, Wan, Flux, Open-Sora and CogVideoX. A name says RoPE when it
holds ``rope``, ``rotary`` or ``freqs`` as a word: ``rope_params``, ``apply_rotary_emb``, ``precompute_freqs_cis``,
``WanRotaryPosEmbed``, ``RoPE3D`` — not ``property`` or ``europe``.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

if TYPE_CHECKING:
    from ..context import PythonFile

ROPE_WORDS = ("rope", "rotary", "freqs")
#: torch dtypes the NPU's AI Core kernels do not compute: what each is, for the message.
DTYPES = {
    "torch.float64": "float64",
    "torch.double": "float64",
    "torch.complex32": "complex",
    "torch.chalf": "complex",
    "torch.complex64": "complex",
    "torch.cfloat": "complex",
    "torch.complex128": "complex",
    "torch.cdouble": "complex",
}
#: Functions that build complex tensors.
COMPLEX_FUNCTIONS = ("torch.view_as_complex", "torch.polar", "torch.complex")
#: Tensor methods that convert to these dtypes.
METHODS = {"double": "float64", "cdouble": "complex", "cfloat": "complex", "chalf": "complex"}
#: dtypes that, as the other branch of a conditional expression, show the code already picks per device.
SINGLE = frozenset(("torch.float32", "torch.float", "torch.float16", "torch.half", "torch.bfloat16"))


def _word_at(name: str, start: int, end: int) -> bool:
    """Whether ``name[start:end]`` is a word of the identifier: bounded by ``_``, a digit, the ends, or a capital
    (``FluxRoPE``, ``RotaryEmbedding``, ``XRopeEmbed``); a plural ``s`` may follow (``ropes``)."""

    def bound(at: int) -> bool:  # the word may end before name[at]
        return at == len(name) or not name[at].isalpha() or name[at].isupper()

    previous = name[start - 1] if start else "_"
    capital = name[start].isupper() and (previous.islower() or name[start + 1].islower())  # xRope, XRope (not GROPE)
    before = not previous.isalpha() or capital
    return before and (bound(end) or (name[end] in "sS" and bound(end + 1)))


def is_rope_name(name: str) -> bool:
    """Whether a function or class name says RoPE (see the module docstring)."""
    low = name.lower()
    for word in ROPE_WORDS:
        start = low.find(word)
        while start != -1:
            if _word_at(name, start, start + len(word)):
                return True
            start = low.find(word, start + 1)
    return False


def rope_scopes(source: "PythonFile") -> List[ast.AST]:
    """The functions and classes of the file whose names say RoPE; once per file."""
    return source.cached(
        "rope_scopes",
        lambda: [
            node
            for node in source.of(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if is_rope_name(node.name)  # type: ignore[attr-defined]
        ],
    )


def rope_scope(source: "PythonFile", node: ast.AST) -> Optional[str]:
    """The name of the innermost function or class around ``node`` whose name says RoPE, or None."""
    scopes = rope_scopes(source)
    parent = source.parents.get(node)
    while parent is not None:
        if any(parent is scope for scope in scopes):
            return parent.name  # type: ignore[attr-defined]
        parent = source.parents.get(parent)
    return None


def wide_dtypes(source: "PythonFile") -> Iterator[Tuple[ast.AST, str, str]]:
    """``(node, kind, shown)`` for every float64 / complex dtype, complex-building call or conversion method in the
    file (``kind``: ``"float64"`` or ``"complex"``; ``shown``: what the code wrote), in RoPE code or not."""
    for node in source.of(ast.Attribute, ast.Name):
        name = node.attr if isinstance(node, ast.Attribute) else node.id  # type: ignore[attr-defined]
        if name in _DTYPE_NAMES:  # resolve only what may be one (`torch.float64`, or `float64` imported from torch)
            qualified = source.resolve(node)
            if qualified in DTYPES and not _picked_per_device(source, node):
                yield node, DTYPES[qualified], qualified
    for call, qualified in source.calls():
        if qualified in COMPLEX_FUNCTIONS:
            yield call, "complex", f"{qualified}()"
        elif qualified is None and isinstance(call.func, ast.Attribute) and call.func.attr in METHODS:
            yield call, METHODS[call.func.attr], f".{call.func.attr}()"


_DTYPE_NAMES = frozenset(name.split(".")[-1] for name in DTYPES)


def _picked_per_device(source: "PythonFile", node: ast.AST) -> bool:
    """``torch.float32 if is_npu else torch.float64``: one branch of a conditional whose other branch is a dtype the
    NPU computes — the code already chooses (diffusers' Flux embeddings do exactly this for NPU and MPS)."""
    parent = source.parents.get(node)
    if not isinstance(parent, ast.IfExp) or parent.test is node:
        return False
    other = parent.orelse if parent.body is node else parent.body
    return isinstance(other, (ast.Attribute, ast.Name)) and source.resolve(other) in SINGLE
