"""NPU101: ``import flash_attn`` (or a module the flash_attn drop-in serves) that is not guarded."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import DROPIN_HANDLER, import_findings, names


@register_rule
class FlashAttnImport(Rule):
    """An unguarded import of ``flash_attn``, ``flash_attn.flash_attn_interface`` or ``flash_attn.bert_padding``.

    flash-attn is built only for CUDA GPUs (and not for every one of them): on an NPU, a CPU or a GPU without a
    matching wheel the import fails, and at module level the whole module with it. Under ``npu-port run`` the
    flash_attn drop-in is served instead (computing through ``npu_port.attention``); ``npu-port fix`` wraps the import
    in ``try`` with the drop-in as the fallback, which changes nothing where flash-attn is installed. Imports of
    flash_attn modules the drop-in does not serve are NPU104; guarded ones are NPU106.

    Example::

        from flash_attn import flash_attn_func            # NPU101
        from flash_attn.bert_padding import pad_input      # NPU101
    """

    code = "NPU101"
    name = "flash-attn-import"
    message = "unguarded flash_attn import: fails without a CUDA flash-attn build"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"  # a safe rewrite exists in principle; npu-port fix does not do it yet
    handled_by = DROPIN_HANDLER["flash_attn"]
    triggers = ("flash_attn",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        def message(kinds, guard, place):
            return (
                f"{names(kinds)} imported unguarded {place}: fails without a CUDA flash-attn build; served by the "
                "drop-in under npu-port run, or guard it with the drop-in as fallback"
            )

        return import_findings(
            self,
            source,
            lambda k, g: k.kind == "handled" and k.by == self.handled_by and g in ("unguarded", "lazy"),
            message,
        )
