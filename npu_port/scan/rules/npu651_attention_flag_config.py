"""NPU651 / NPU652: xformers and flash-attention switches in YAML / JSON configs."""

from __future__ import annotations

import re
from typing import Iterator, Optional, Tuple

from ..context import TextFile
from ..rule import Finding, Rule, register_rule
from ._misc import flag

CONFIG_FILES = ("*.yaml", "*.yml", "*.json")
#: ``key: value`` pairs (YAML block or flow style, list items) and ``"key": value`` (JSON).
_SETTING = re.compile(r"""(?:^\s*(?:-\s+)?|[{,]\s*)["']?([A-Za-z_][\w-]*)["']?\s*:\s*(["']?[^\s"',#{}\[\]]+["']?)""")
_COMMENT = re.compile(r"(?:^|\s)#.*$")
FLAG_TRIGGERS = ("xformers", "flash_att", "flash-att", "flash_attention")


def config_flags(source: TextFile) -> Iterator[Tuple[int, str, str]]:
    """``(line, backend, setting)`` for every attention switch a config file turns on."""
    for number, line in enumerate(source.lines, start=1):
        for match in _SETTING.finditer(_COMMENT.sub("", line)):
            found: Optional[Tuple[str, str]] = flag(match.group(1), match.group(2))
            if found is not None:
                yield number, found[0], found[1]
                break  # one finding a line


@register_rule
class AttentionFlagConfig(Rule):
    """A config file (YAML, JSON) that switches xformers or flash-attn on: ``enable_xformers_memory_efficient_attention:
    true``, ``use_xformers``, ``enable_flash_attn``, ``use_flash_attn``, ``attention_mode: xformers``, ...

    The project reads the flag and calls ``pipe.enable_xformers_memory_efficient_attention()`` or imports
    xformers / flash_attn — which raise without CUDA, and work under ``npu-port run`` (its xformers hook routes the
    switch to the active attention strategy; its drop-ins serve the imports). Nothing to change to run under
    npu-port; outside it, turn the flag off on the target.

    Example::

        enable_xformers_memory_efficient_attention: true   # NPU651
        model: {type: STDiT, enable_flash_attn: true}       # NPU651 (on the line of the key)
    """

    code = "NPU651"
    name = "attention-flag-config"
    message = "config switches xformers / flash-attn on"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = "npu-port run's xformers hook and the flash_attn / xformers drop-ins"
    triggers = FLAG_TRIGGERS
    file_patterns = CONFIG_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        for number, backend, setting in config_flags(source):
            if backend in ("xformers", "flash-attn"):
                yield source.finding(
                    self,
                    number,
                    f"`{setting}` switches {backend} on: it raises without CUDA, works under npu-port run "
                    f"(or turn it off on the target)",
                )


@register_rule
class FlashAttention2Config(Rule):
    """A config that asks transformers for flash-attention 2 / 3: ``attn_implementation: flash_attention_2``,
    ``use_flash_attention_2: true``.

    transformers checks for the flash_attn package *and* a CUDA GPU when the model is loaded and raises without
    them; npu-port's flash_attn drop-in does not pass that check. Ask for ``sdpa`` (PyTorch's attention, which
    ``npu-port run`` routes to the device's fused kernel) — same results, another kernel, hence an unsafe fix (made by
    hand: ``npu-port fix`` rewrites Python only, and lists this finding).

    Example::

        attn_implementation: flash_attention_2   # NPU652
    """

    code = "NPU652"
    name = "flash-attention-2-config"
    message = 'config asks transformers for flash_attention_2, which raises without CUDA: use "sdpa"'
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "unsafe"
    triggers = ("flash_attention_2", "flash_attention_3", "flash_attn_2")
    file_patterns = CONFIG_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        for number, backend, setting in config_flags(source):
            if backend.startswith("flash_attention_"):
                yield source.finding(
                    self, number, f'`{setting}` asks transformers for {backend}, which raises without CUDA: use "sdpa"'
                )
