"""``flash_attn``: ``flash_attn.flash_attn_func`` (FlashAttention 2), when a working build is installed.

flash-attn takes ``(B, S, H, D)`` tensors, float16 / bfloat16 only, head_dim up to 256 and the same for q, k and v,
no attention mask (padding needs ``flash_attn_varlen_func``), and aligns ``causal=True`` to the *bottom-right*
corner when q_len != key_len — not SDPA's top-left — so that case is refused rather than silently changed.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from ...device.detect import backend_status
from ...reasons import Reason
from ..call import AttentionCall
from ..registry import register_kernel
from .base import Kernel


@register_kernel
class FlashAttnKernel(Kernel):
    """flash_attn.flash_attn_func with SDPA semantics, for the calls it can express exactly."""

    name = "flash_attn"
    summary = "flash_attn.flash_attn_func (FlashAttention 2; no masks; (B, S, H, D) layout)"
    priority = 50
    default_selection = False
    listing_order = 70
    package = "flash_attn"
    device_types = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)
    max_head_dim = 256
    supports_float_mask = False

    def device_reasons(self) -> List[Reason]:
        if backend_status("cuda").available:  # not torch.cuda.is_available(): transfer_to_npu makes it lie
            return []
        return [
            Reason(
                "no-device",
                "flash_attn is installed but no CUDA device is visible (torch.cuda.is_available() is False)",
            )
        ]

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        found: List[Reason] = []
        if call.mask is not None:
            found.append(
                Reason(
                    "mask",
                    "flash_attn_func takes no attention mask (key padding needs flash_attn_varlen_func); "
                    "use sdpa or chunked for masked calls",
                )
            )
        if call.is_causal and call.q_len != call.key_len:
            found.append(
                Reason(
                    "causal",
                    f"is_causal with q_len {call.q_len} != key_len {call.key_len}: flash-attn aligns the causal "
                    "mask bottom-right, SDPA top-left",
                )
            )
        if call.value_dim != call.head_dim:
            found.append(
                Reason(
                    "head-dim",
                    f"value head_dim {call.value_dim} != head_dim {call.head_dim} (flash-attn needs them equal)",
                )
            )
        return found

    def run(self, call: AttentionCall) -> Tensor:
        flash_attn = self.package_status().module
        out = flash_attn.flash_attn_func(
            call.query.transpose(1, 2),
            call.key.transpose(1, 2),
            call.value.transpose(1, 2),
            dropout_p=call.dropout_p,
            softmax_scale=call.scale,
            causal=call.is_causal,
        )
        return out.transpose(1, 2)
