"""NPU114: a call of something of flash-attention's that npu-port's flash_attn drop-in does not serve."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._attention_calls import (
    FLASH_CAUSAL_AT,
    FLASH_PADDING,
    FLASH_REFUSED,
    flash_library_calls,
    flash_missing,
    unpacked_into,
)


@register_rule
class FlashAttnUnserved(Rule):
    """A call the flash_attn drop-in cannot serve: flash-attn's internal kernels (``_flash_attn_forward``,
    ``_flash_attn_backward``, the varlen forms; ``_wrapped_flash_attn_forward`` is defined only to refuse), anything
    of FlashAttention 3's (``flash_attn_interface``, ``flash_attn_3``: Hopper-only, no drop-in), a module the drop-in
    does not serve (``flash_attn.flash_attn_triton.flash_attn_func``, ``flash_attn.layers.rotary``), and
    ``unpad_input`` unpacked into four names (the drop-in's returns five, as flash-attn >= 2.6's does).

    Each raises under ``npu-port run`` (ImportError, AttributeError, DropInError or ValueError), on every target;
    the import is NPU104 as well — the call is where the code has to change. Calls through a module attribute or an
    alias count (``fa3 = flash_attn_interface.flash_attn_varlen_func``); a project's own function or module of the
    name does not. The flash_attn functions the drop-in serves are NPU110 / NPU111.

    Example::

        out, lse = _flash_attn_forward(q, k, v, 0.0, scale, causal=True)              # NPU114
        out = flash_attn_interface.flash_attn_varlen_func(q, k, v, cu, cu, m, m)       # NPU114
        x, indices, cu_seqlens, max_len = unpad_input(hidden, mask)                    # NPU114
    """

    code = "NPU114"
    name = "flash-attn-unserved"
    message = "flash-attention call npu-port's flash_attn drop-in does not serve: raises under npu-port run"
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("flash_attn",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in flash_library_calls(source):
            text = _why(source, call, qualified)
            if text is not None:
                yield source.finding(self, call, text)


def _why(source: PythonFile, call: ast.Call, qualified: str) -> Optional[str]:
    """What breaks in this call under the drop-in, and what to do; None when the drop-in serves it."""
    function = qualified.rsplit(".", 1)[-1]
    missing = flash_missing(qualified)
    if function.startswith("_") and "flash_attn" in function and (missing is not None or function in FLASH_REFUSED):
        how = "refuses it (DropInError)" if missing is None else "does not define it (ImportError / AttributeError)"
        return (
            f"`{function}` is flash-attn's internal kernel (it returns the softmax log-sum-exp): npu-port's flash_attn "
            f"drop-in {how}; call npu_port.attention (it can return the log-sum-exp) or flash_attn_func"
        )
    if missing is not None and missing.split(".", 1)[0] != "flash_attn":
        instead = (
            f"flash_attn's `{function}` (served; FA3's may also return the log-sum-exp: check what is unpacked)"
            if function in FLASH_CAUSAL_AT
            else "flash_attn's functions (served)"
        )
        return (
            f"`{qualified}` is FlashAttention 3's (Hopper-only): npu-port has no drop-in for `{missing}` (ImportError "
            f"under npu-port run); call {instead} or npu_port.attention"
        )
    if missing is not None:
        return (
            f"`{qualified}`: npu-port's flash_attn drop-in does not serve `{missing}` (ImportError / AttributeError "
            "under npu-port run); call the drop-in's functions (flash_attn_func, ...) or npu_port.attention"
        )
    if qualified == f"{FLASH_PADDING}.unpad_input" and unpacked_into(source, call) == 4:
        return (
            "`unpad_input` unpacked into four names: npu-port's drop-in returns five (flash-attn >= 2.6's), a "
            "ValueError under npu-port run; unpack the fifth too (`..., max_seqlen, *_ = unpad_input(...)`)"
        )
    return None
