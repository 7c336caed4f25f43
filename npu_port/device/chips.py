"""Which Ascend chip a name means, and what its attention hardware can do.

Plans are made before anyone has NPU time (``npu-port plan --chip 910B``), and doctor warns on an NPU whose chip has
no fused attention, so both need one table of chips rather than string tests scattered through the code. The
families and their limits come from torch_npu's and op-plugin's sources: the SoC enum in
``Ascend/pytorch:torch_npu/csrc/core/npu/NpuVariables.h`` (910A = 102, 310P = 200-207, 910B1 = 220, A3 = 250+,
950 = 260) and op-plugin's ``ScaledDotProductAttentionKernelNpuOpApi.cpp``, which sends SDPA to FlashAttentionScore
only from Ascend910B1 on; ``npu_fusion_attention`` / ``npu_fused_infer_attention_score`` document Atlas A2 / A3
(910B / 910C) products, and flash-attn-npu supports 910B / 910C / 950 (its v2 API not on 950). Reference notes:
``shared/reference/ascend_2026-11.md`` sections 1 and 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ..errors import DeviceError

__all__ = ["CHIPS", "DEFAULT_CHIP", "Chip", "chip_from_device_name", "current_chip", "resolve_chip"]


@dataclass(frozen=True)
class Chip:
    """One Ascend chip family as npu-port plans for it."""

    #: the name users pass (``--chip 910B``)
    name: str
    #: what the product line is called in Ascend's documents
    product: str
    #: whether FlashAttentionScore / PromptFlashAttention exist: npu_fusion_attention, npu_fused_infer_attention_score
    #: and torch_npu's SDPA fast path; without them every attention call builds the whole score matrix
    fused_attention: bool
    #: whether flash-attn-npu's flash-attn 2 API (``flash_attn_npu``) imports on this chip
    flash_attn_npu_v2: bool
    #: one line on what this chip means for attention
    note: str


CHIPS: Dict[str, Chip] = {
    chip.name: chip
    for chip in (
        Chip(
            "910A",
            "Ascend 910 (first generation, Atlas 800 training 9000)",
            False,
            False,
            "no FlashAttentionScore: npu_fusion_attention is not available and SDPA always runs the math path",
        ),
        Chip("910B", "Atlas A2 (Ascend 910B1-B4, Atlas 800T/800I A2)", True, True, "fused attention ops documented"),
        Chip("910C", "Atlas A3 (Ascend 910C / 910_93xx)", True, True, "fused attention ops documented"),
        Chip(
            "950",
            "Ascend 950 (950PR / 950DT)",
            True,
            False,
            "fused attention ops available; flash-attn-npu has only its FA3 / FA4 APIs here",
        ),
        Chip(
            "310P",
            "Atlas 300I Duo / 300I Pro (Ascend 310P)",
            False,
            False,
            "inference card without FlashAttentionScore: attention always builds the whole score matrix",
        ),
    )
}
#: The chip plans assume when none is named: the most common Ascend training / inference chip today.
DEFAULT_CHIP = "910B"

#: ``torch.npu.get_device_name()`` patterns -> chip name, first match wins ("Ascend910B3", "Ascend910_9392",
#: "Ascend910ProB", "Ascend310P3", "Ascend950PR").
_DEVICE_NAME_PATTERNS: Tuple[Tuple[re.Pattern, str], ...] = (
    (re.compile(r"910B\d", re.IGNORECASE), "910B"),
    (re.compile(r"910_?93", re.IGNORECASE), "910C"),
    (re.compile(r"910C", re.IGNORECASE), "910C"),
    (re.compile(r"950", re.IGNORECASE), "950"),
    (re.compile(r"310P", re.IGNORECASE), "310P"),
    (re.compile(r"910(A|ProA|ProB|PremiumA)?$", re.IGNORECASE), "910A"),
)


def resolve_chip(name: str) -> Chip:
    """The chip a user named (case-insensitive, an ``Ascend`` prefix allowed); a clear error lists the choices."""
    if not isinstance(name, str):
        raise DeviceError(f"chip must be a string such as '910B', got {type(name).__name__}")
    key = name.strip().upper()
    key = key[len("ASCEND") :].strip() if key.startswith("ASCEND") else key
    chip = CHIPS.get(key) or _match_device_name(name)
    if chip is None:
        raise DeviceError(f"unknown Ascend chip {name!r}; valid chips: {', '.join(CHIPS)}")
    return chip


def _match_device_name(name: str) -> Optional[Chip]:
    text = name.strip().replace(" ", "")
    for pattern, chip_name in _DEVICE_NAME_PATTERNS:
        if pattern.search(text):
            return CHIPS[chip_name]
    return None


def chip_from_device_name(device_name: str) -> Optional[Chip]:
    """The chip behind ``torch.npu.get_device_name()``'s text, or None for a name this table does not know."""
    return _match_device_name(device_name) if isinstance(device_name, str) else None


def current_chip() -> Optional[Chip]:
    """The chip of NPU 0 when torch_npu is loaded and a device is visible; None otherwise (never imports torch_npu:
    importing it without CANN breaks ``import torch``)."""
    import sys

    if "torch_npu" not in sys.modules:
        return None
    import torch

    npu = getattr(torch, "npu", None)
    try:
        if npu is None or not npu.is_available():
            return None
        return chip_from_device_name(str(npu.get_device_name(0)))
    except Exception:  # a half-initialised driver: no chip known, the device checks report it
        return None
