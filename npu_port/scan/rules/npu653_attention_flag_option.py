"""NPU653: a command-line option or a parameter default that switches xformers or flash-attn on."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._misc import flag
from .npu651_attention_flag_config import FLAG_TRIGGERS


@register_rule
class AttentionFlagOption(Rule):
    """``parser.add_argument("--enable_xformers_memory_efficient_attention", action="store_true")`` (or
    ``--use_xformers``, ``--enable-flash-attn``, ...): a command line that switches xformers or flash-attn on.

    With the option given, the script calls ``enable_xformers_memory_efficient_attention()`` or imports xformers /
    flash_attn, which raise without CUDA; under ``npu-port run`` they work (its xformers hook and drop-ins). The
    message says whether the option is on by default (``default=True``, ``action="store_false"``: reported on the
    default) or only when a launch script passes it. A function's parameter defaulting such a flag on
    (``enable_xformers_memory_efficient_attention: bool = True``, ``use_xformers=True``) switches it on for every
    caller that does not pass it: reported on the default.

    Example::

        parser.add_argument("--enable_xformers_memory_efficient_attention", action="store_true")   # NPU653
        def build(unet, use_xformers: bool = True): ...                                            # NPU653
    """

    code = "NPU653"
    name = "attention-flag-option"
    message = "command-line option or parameter default switches xformers / flash-attn on"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = "npu-port run's xformers hook and the flash_attn / xformers drop-ins"
    triggers = FLAG_TRIGGERS
    #: an option of argparse's, or a default of True (a flag merely named in a model file is neither)
    also_triggers = ("add_argument", re.compile(r"=\s*True\b"))

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, _ in source.calls():
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                continue
            options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            found = next((flag(o, None) for o in options if o.startswith("-") and flag(o, None)), None)
            if found is None:
                continue
            default = _keyword(call, "default")
            action = _keyword(call, "action")
            if default is None and isinstance(action, ast.Constant) and action.value == "store_false":
                default = action  # store_false: on unless the option is given
            on = default is not None and (_is_true(default) or default is action)
            yield source.finding(
                self,
                default if on else call,
                f"option `{options[0]}` switches {found[0]} on{' by default' if on else ' when given'}: it raises "
                "without CUDA, works under npu-port run (or leave it off on the target)",
            )
        for default in source.of(ast.Constant):  # each `True`, then its parameter: cheaper than every signature
            if default.value is not True:  # type: ignore[attr-defined]
                continue
            parameter = _parameter_of(source, default)
            found = flag(parameter, None) if parameter is not None else None
            if found is not None:
                yield source.finding(
                    self,
                    default,
                    f"parameter `{parameter}` defaults {found[0]} on: every caller that does not pass it raises "
                    "without CUDA, works under npu-port run (or default it to False on the target)",
                )


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
