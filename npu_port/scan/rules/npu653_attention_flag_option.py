"""NPU653: a command-line option that switches xformers or flash-attn on."""

from __future__ import annotations

import ast
from typing import Iterator

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
    message says whether the option is on by default (``default=True``) or only when a launch script passes it.

    Example::

        parser.add_argument("--enable_xformers_memory_efficient_attention", action="store_true")   # NPU653
    """

    code = "NPU653"
    name = "attention-flag-option"
    message = "command-line option switches xformers / flash-attn on"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = "npu-port run's xformers hook and the flash_attn / xformers drop-ins"
    triggers = FLAG_TRIGGERS
    also_triggers = ("add_argument",)  # an option of argparse's: a flag named in a model file is not one

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, _ in source.calls():
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                continue
            options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            found = next((flag(o, None) for o in options if o.startswith("-") and flag(o, None)), None)
            if found is None:
                continue
            default = next((k.value for k in call.keywords if k.arg == "default"), None)
            on = isinstance(default, ast.Constant) and default.value is True
            yield source.finding(
                self,
                call,
                f"option `{options[0]}` switches {found[0]} on{' by default' if on else ' when given'}: it raises "
                "without CUDA, works under npu-port run (or leave it off on the target)",
            )
