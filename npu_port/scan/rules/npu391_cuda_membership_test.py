"""NPU391: ``"cuda" in device`` — a substring test for CUDA on a device or its name."""

from __future__ import annotations

import ast
from typing import Iterator, List, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import guarded_finding

#: Words of a name that holds a device or its name (``device``, ``self.dev``, ``x.device.type``, ``map_location``).
DEVICE_WORDS = ("device", "accelerator", "map_location")
DEVICE_NAMES = ("dev", "type", "place")
#: Where ``"cuda"`` is looked for in text that is not a device: command lines, environments, messages.
NOT_DEVICES = ("sys.argv", "os.environ")
TEXT_WORDS = ("argv", "environ", "msg", "message", "text", "line", "err", "exc", "error", "log", "help", "doc")
#: Wrappers that make a device its name: ``str(d)``, ``repr(d)``, ``d.lower()``.
TO_TEXT = ("str", "repr")


def _words(node: ast.AST) -> Optional[List[str]]:
    """The identifiers of a dotted chain, calls and subscripts included, innermost first (``str(self.device).lower()``
    -> ``["self", "device"]`` with ``str`` and ``lower`` peeled off); None for anything else (a literal, an
    expression)."""
    words: List[str] = []
    while True:
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in TO_TEXT and len(node.args) == 1:
                node = node.args[0]
                continue
            if isinstance(func, ast.Attribute) and func.attr in ("lower", "strip", "values", "keys"):
                node = func.value
                continue
            node = func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            words.append(node.id)
            return list(reversed(words))
        else:
            return None


def _device_word(word: str) -> bool:
    word = word.lower()
    return any(w in word for w in DEVICE_WORDS) or word in DEVICE_NAMES or word.endswith("_dev")


def _as_text(node: ast.AST) -> bool:
    """``str(x)`` / ``repr(x)`` of a name or attribute: a device's name, unless the text words say otherwise."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in TO_TEXT
        and len(node.args) == 1
        and isinstance(node.args[0], (ast.Name, ast.Attribute))
    )


def device_membership(source: PythonFile, node: ast.Compare) -> bool:
    """``"cuda" in device``, ``"cuda" not in str(d)``, ``"cuda" in x.device.type``, ``"cuda:0" in device_map.values()``:
    ``"cuda"`` (or ``"cuda:N"``) looked for in something named like a device, or in ``str()`` of a name — not in a
    literal list (``"cuda" in ["cpu", "cuda"]``), ``sys.argv``, ``os.environ``, an exception or a message."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.In, ast.NotIn)):
        return False
    left, right = node.left, node.comparators[0]
    if not (isinstance(left, ast.Constant) and isinstance(left.value, str)):
        return False
    if not (left.value == "cuda" or left.value.startswith("cuda:")):
        return False
    words = _words(right)
    if not words or source.resolve(right) in NOT_DEVICES:
        return False
    if any(text in word.lower() for word in words for text in TEXT_WORDS):
        return False
    inner = right.args[0] if _as_text(right) else right  # type: ignore[attr-defined]
    if isinstance(inner, ast.Name) and _caught(source, inner):
        return False  # `"cuda" in str(e)`: an exception's message
    return any(_device_word(word) for word in words) or _as_text(right)


def _caught(source: PythonFile, name: ast.Name) -> bool:
    """Whether ``name`` is bound by an ``except ... as`` around it."""
    parent = source.parents.get(name)
    while parent is not None:
        if isinstance(parent, ast.ExceptHandler) and parent.name == name.id:
            return True
        parent = source.parents.get(parent)
    return False


@register_rule
class CudaMembershipTest(Rule):
    """``"cuda" in device``, ``"cuda" not in str(d)``, ``"cuda" in x.device.type``: a substring test for CUDA on a
    device, its name or its type (``"cuda"`` looked for in something named like a device, or in ``str()`` of a name).

    On an NPU the device is ``"npu"``: the test is False and the code silently takes its non-CUDA branch (often
    the CPU's: no pinned memory, no autocast, float32). ``npu-port run`` does not rewrite these (it rewrites the
    ``==`` checks of NPU390). Compare the device's type with the target's instead: ``torch.device(d).type ==
    torch.accelerator.current_accelerator().type`` (torch 2.6 and later; ``npu_port.get_device().type`` before). Not
    reported: ``"cuda"`` looked for in a literal list, ``sys.argv``, ``os.environ``, an exception or a message.

    Example::

        if "cuda" in str(device):      # NPU391
            x = x.pin_memory()
    """

    code = "NPU391"
    name = "cuda-membership-test"
    message = '`"cuda" in device` is False on an NPU: the non-CUDA branch runs'
    severity = "perf"
    targets = ("npu",)
    fix = "manual"
    triggers = ('"cuda', "'cuda")

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.Compare):
            if device_membership(source, node):  # type: ignore[arg-type]
                yield guarded_finding(
                    source,
                    self,
                    node,
                    '`"cuda" in <device>` is False on an NPU: the non-CUDA branch runs silently; compare the '
                    "device's type with the target's (`torch.accelerator.current_accelerator().type`)",
                )
