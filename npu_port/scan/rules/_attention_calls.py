"""Shared helpers of the NPU1xx attention-call rules: which calls are flash_attn's and xformers', and what their
arguments are (positional or keyword)."""

from __future__ import annotations

import ast
from typing import Dict, Iterator, Optional, Tuple

from ..context import PythonFile

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


def flash_calls(source: PythonFile) -> Iterator[Tuple[ast.Call, str]]:
    """``(call, function name)`` for every call of a flash_attn function the drop-in serves."""
    for call, name in source.calls():
        if name and "." in name:
            module, function = name.rsplit(".", 1)
            if module in FLASH_MODULES and function in FLASH_CAUSAL_AT:
                yield call, function


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
