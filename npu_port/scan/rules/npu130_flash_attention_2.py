"""NPU130: transformers' ``attn_implementation="flash_attention_2"``."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule

_VALUES = ("flash_attention_2", "flash_attention_3")
_KEYS = ("attn_implementation", "_attn_implementation")


@register_rule
class FlashAttention2Implementation(Rule):
    """``attn_implementation="flash_attention_2"`` (or ``"flash_attention_3"``) given to ``from_pretrained``, a
    config, ``dict(...)`` or a ``{...}`` of model kwargs, or set as ``config._attn_implementation``; also the old
    ``use_flash_attention_2=True``.

    transformers checks for a CUDA flash-attn when the model is built and raises ImportError / ValueError where there
    is none (NPU, CPU, a GPU without the wheel). ``"sdpa"`` works everywhere; that change is an unsafe fix (on CUDA it
    changes the kernel): ``npu-port fix --unsafe-fixes`` writes ``"sdpa"`` in place of a literal
    ``"flash_attention_2"`` / ``"flash_attention_3"``; a value chosen in one branch and ``use_flash_attention_2=True``
    are left to you.

    Example::

        model = AutoModel.from_pretrained(path, attn_implementation="flash_attention_2")  # NPU130
    """

    code = "NPU130"
    name = "transformers-flash-attention-2"
    message = 'attn_implementation="flash_attention_2" raises without flash-attn: use "sdpa"'
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "unsafe"
    triggers = ("flash_attention_2", "flash_attention_3", "use_flash_attention_2")

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.keyword, ast.Dict, ast.Assign):
            if isinstance(node, ast.keyword) and node.arg in _KEYS and _flash_value(node.value):
                yield self._finding(source, node.value)
            elif isinstance(node, ast.keyword) and node.arg == "use_flash_attention_2" and not _false(node.value):
                yield source.finding(
                    self, node.value, 'use_flash_attention_2=True raises without flash-attn: attn_implementation="sdpa"'
                )
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value in _KEYS and _flash_value(value):
                        yield self._finding(source, value)
            elif isinstance(node, ast.Assign) and _flash_value(node.value):
                if any(isinstance(t, ast.Attribute) and t.attr in _KEYS for t in node.targets):
                    yield self._finding(source, node.value)

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """A string literal ``"flash_attention_2"`` (any quote) -> ``"sdpa"`` in the same quotes."""
        import libcst as cst

        if not isinstance(node, cst.SimpleString) or node.evaluated_value not in _VALUES:
            return None
        return node.with_changes(value=node.value.replace(str(node.evaluated_value), "sdpa"))

    def _finding(self, source: PythonFile, value: ast.AST) -> Finding:
        branch = " (in one branch)" if isinstance(value, ast.IfExp) else ""
        return source.finding(
            self, value, f'attn_implementation="flash_attention_2"{branch} raises without a CUDA flash-attn when '
            'the model is built: use "sdpa" (works on NPU, CPU and GPU)'
        )  # fmt: skip


def _flash_value(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in _VALUES
    if isinstance(node, ast.IfExp):
        return _flash_value(node.body) or _flash_value(node.orelse)
    return False


def _false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, None)
