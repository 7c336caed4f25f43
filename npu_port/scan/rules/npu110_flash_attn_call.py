"""NPU110: a call of a flash_attn function, with the arguments whose semantics need care."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._attention_calls import (
    FLASH_CAUSAL_AT,
    FLASH_PADDING,
    FLASH_UNSUPPORTED,
    argument,
    flash_calls,
    flash_library_calls,
    flash_missing,
    is_constant,
    unpacked_into,
)
from ._imports import DROPIN_HANDLER


@register_rule
class FlashAttnCall(Rule):
    """A call of ``flash_attn_func``, ``flash_attn_varlen_func``, the qkv/kv-packed forms or
    ``flash_attn_with_kvcache`` (from ``flash_attn`` or ``flash_attn.flash_attn_interface``).

    Under ``npu-port run`` the flash_attn drop-in computes it through ``npu_port.attention`` with flash-attn's own
    semantics. The message names what needs care if you replace the call by hand: ``causal=True`` is aligned to the
    *bottom-right* corner (query ``i`` sees keys ``j <= i + Skv - Sq``) where SDPA's ``is_causal`` is top-left — they
    agree only when ``Sq == Skv``; ``window_size`` is a band SDPA has no argument for (it needs a mask); the varlen
    forms pack sequences (``cu_seqlens``: a block-diagonal mask). Arguments the drop-in cannot compute are NPU111.
    ``flash_attn.bert_padding``'s ``pad_input``, ``unpad_input``, ``index_first_axis`` and ``index_put_first_axis``
    are served too (plain tensor indexing); ``unpad_input`` unpacked into four names is NPU114.

    Example::

        out = flash_attn_func(q, k, v, causal=True)                   # NPU110
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, window_size=(256, 0))  # NPU110
        hidden = pad_input(out, indices, batch, seqlen)                                 # NPU110
    """

    code = "NPU110"
    name = "flash-attn-call"
    message = "flash_attn call: served by npu-port's flash_attn drop-in (attention through npu_port.attention)"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = DROPIN_HANDLER["flash_attn"]
    triggers = ("flash_attn",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, function in flash_calls(source):
            if any(not is_constant(argument(call, k), v) for k, v in FLASH_UNSUPPORTED.items()):
                continue  # NPU111's
            at = FLASH_CAUSAL_AT[function]
            care = []
            if not is_constant(argument(call, "causal", at), False):
                care.append(
                    "causal is bottom-right aligned (query i sees keys <= i + Skv - Sq; SDPA's is_causal is "
                    "top-left: the same only when Sq == Skv)"
                )
            if not is_constant(argument(call, "window_size", None if at is None else at + 1), (-1, -1)):
                care.append("window_size is a band around that diagonal (SDPA needs an explicit mask for it)")
            if "varlen" in function:
                care.append("cu_seqlens packs sequences (block-diagonal attention)")
            detail = "; ".join(care) if care else "no argument that needs care"
            yield source.finding(
                self, call, f"`{function}` runs through npu_port.attention under the drop-in: {detail}"
            )
        for call, qualified in flash_library_calls(source):
            module, function = qualified.rsplit(".", 1)
            if module != FLASH_PADDING or flash_missing(qualified) is not None:
                continue
            if function == "unpad_input" and unpacked_into(source, call) == 4:
                continue  # NPU114's: the drop-in returns five
            five = "; it returns five values, as flash-attn >= 2.6's does" if function == "unpad_input" else ""
            yield source.finding(
                self, call, f"`{function}` is served by the drop-in's bert_padding (plain tensor indexing){five}"
            )
