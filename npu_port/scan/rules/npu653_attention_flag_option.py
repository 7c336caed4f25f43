"""NPU653: a command-line option, a parameter default or a backend argument that switches xformers or flash-attn on."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import imports
from ._misc import flag, normal
from .npu651_attention_flag_config import FLAG_TRIGGERS


@register_rule
class AttentionFlagOption(Rule):
    """``parser.add_argument("--enable_xformers_memory_efficient_attention", action="store_true")`` (or
    ``--use_xformers``, ``--enable-flash-attn``, ...): a command line that switches xformers or flash-attn on.

    With the option given, the script calls ``enable_xformers_memory_efficient_attention()`` or imports xformers /
    flash_attn, which raise without CUDA; under ``npu-port run`` they work (its xformers hook and drop-ins). Reported
    when the option is on by default: ``default=True`` or ``action="store_false"`` (on the default), a negated option
    given as ``store_true`` (``--without-xformers``, on the call). An option off unless a launch script passes it is
    not: the switch it gates is reported where it is (NPU120, the imports). A function's parameter defaulting such a
    flag on (``enable_xformers_memory_efficient_attention: bool = True``, ``use_xformers=True``) switches it on for
    every caller that does not pass it: reported on the default — a flash-attn-named one only in a file that imports
    flash-attn (elsewhere ``flash_attn=True`` is usually torch's own flash SDPA). A call's argument choosing the
    backend (``attn_mode="softmax-xformers"``) is reported on the value.

    Example::

        parser.add_argument("--use_xformers", action="store_false")                                 # NPU653
        parser.add_argument("--without-xformers", action="store_true")                              # NPU653
        def build(unet, use_xformers: bool = True): ...                                            # NPU653
    """

    code = "NPU653"
    name = "attention-flag-option"
    message = "a command-line option, parameter default or backend argument switches xformers / flash-attn on"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = "npu-port run's xformers hook and the flash_attn / xformers drop-ins"
    triggers = FLAG_TRIGGERS
    #: an option of argparse's, a default of True, or a backend argument (a flag merely named in a model file is
    #: none of these)
    also_triggers = ("add_argument", re.compile(r"=\s*True\b"), re.compile(r"\b_?(?:attn|attention)_\w+\s*=\s*[\"']"))

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, _ in source.calls():
            for keyword in call.keywords:
                yield from self._backend_argument(source, keyword)
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                continue
            found = _option(self, source, call)
            if found is not None:
                yield found
        for default in source.of(ast.Constant):  # each `True`, then its parameter: cheaper than every signature
            if default.value is not True:  # type: ignore[attr-defined]
                continue
            parameter = _parameter_of(source, default)
            found = flag(parameter, None) if parameter is not None else None
            if found is not None and (found[0] != "flash-attn" or _uses_flash_attn(source)):
                yield source.finding(
                    self,
                    default,
                    f"parameter `{parameter}` defaults {found[0]} on: every caller that does not pass it raises "
                    "without CUDA, works under npu-port run (or default it to False on the target)",
                )

    def _backend_argument(self, source: PythonFile, keyword: ast.keyword) -> Iterator[Finding]:
        """``Block(attn_mode="softmax-xformers")``: an argument choosing xformers (or flash-attn, in a file that
        imports it) as the attention backend, reported on the value."""
        value = keyword.value
        if keyword.arg is None or not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
            return
        found = flag(keyword.arg, value.value)
        if found is not None and found[0] in ("xformers", "flash-attn"):
            if found[0] == "xformers" or _uses_flash_attn(source):
                yield source.finding(
                    self,
                    value,
                    f"`{keyword.arg}={value.value!r}` switches {found[0]} on: it raises without CUDA, works under "
                    "npu-port run (or pick another backend on the target)",
                )

    def _on_by_default(self, source: PythonFile, node: ast.AST, option: str, what: str) -> Finding:
        return source.finding(
            self,
            node,
            f"option `{option}` switches {what} on by default: it raises without CUDA, works under npu-port run (or "
            "default it off on the target)",
        )


def _option(rule: AttentionFlagOption, source: PythonFile, call: ast.Call) -> Optional[Finding]:
    """The finding for an ``add_argument`` call whose default switches xformers / flash-attn on: a flag defaulting
    to ``True`` (``default=True``, ``action="store_false"``; reported on the default), or a negated flag defaulting
    to ``False`` (``--without-xformers``, ``action="store_true"``; reported on the call). An option off unless given
    is not reported: the switch it gates is (NPU120, the imports)."""
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [o for o in options if o.startswith("-")]
    if not longs:
        return None
    dest = _keyword(call, "dest")
    names = [dest.value] if isinstance(dest, ast.Constant) and isinstance(dest.value, str) else longs
    default = _keyword(call, "default")
    action = _keyword(call, "action")
    kind = action.value if isinstance(action, ast.Constant) else None
    for name in names:
        found = flag(name, None)
        if found is not None:
            if default is not None and _is_true(default):
                return rule._on_by_default(source, default, longs[0], found[0])
            if default is None and kind == "store_false":
                return rule._on_by_default(source, action, longs[0], found[0])
        negated = _negated(name)
        if negated is not None:
            off = default is not None and isinstance(default, ast.Constant) and default.value is False
            if off or (default is None and kind == "store_true"):
                return rule._on_by_default(source, call, longs[0], negated)
    return None


#: Prefixes of an option that switches a backend off (``--without-xformers``, ``--disable_flash_attn``).
_NEGATIONS = ("without_", "disable_", "no_", "not_use_", "dont_use_")


def _negated(name: str) -> Optional[str]:
    """What a negated flag's name switches off (``without_xformers`` -> ``xformers``), or None."""
    key = normal(name)
    for prefix in _NEGATIONS:
        if key.startswith(prefix):
            rest = key[len(prefix) :]
            found = flag(rest, None) or flag(f"use_{rest}", None)
            return found[0] if found is not None else None
    return None


def _uses_flash_attn(source: PythonFile) -> bool:
    """Whether the file imports the flash-attn library: a parameter named ``flash_attn`` elsewhere is usually torch's
    own flash SDPA switch (``Attend(flash=flash_attn)``), which runs on the target."""
    return any(found.module.split(".")[0].startswith("flash_attn") for found in imports(source))


def _parameter_of(source: PythonFile, default: ast.AST) -> Optional[str]:
    """The name of the parameter whose default ``default`` is; None when it is no parameter's default."""
    arguments = source.parents.get(default)
    if not isinstance(arguments, ast.arguments):
        return None
    positional = arguments.posonlyargs + arguments.args
    for parameter, value in zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults):
        if value is default:
            return parameter.arg
    for parameter, value in zip(arguments.kwonlyargs, arguments.kw_defaults):
        if value is default:
            return parameter.arg
    return None


def _keyword(call: ast.Call, name: str) -> Optional[ast.AST]:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
