"""``xformers``: ``xformers.ops.memory_efficient_attention``, when a working build is installed.

xformers wants BMHK layout (``(B, S, H, K)``; grouped-query attention as BMGHK), additive biases only (no bool
masks), bias rows aligned to 8 elements, and ``LowerTriangularMask`` for causal attention (top-left, as SDPA). Its
own dispatcher decides between flash / cutlass / fa3 ops and explains refusals; those explanations are passed on.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import Tensor

from ...device.detect import backend_status
from ...errors import KernelRuntimeError
from ...reasons import Reason
from ..call import AttentionCall
from ..registry import register_kernel
from .base import Kernel, unmask_empty_rows, zero_fully_masked_rows

#: xformers' cutlass op needs ``attn_bias.stride(-2) % 8 == 0``.
BIAS_ALIGNMENT = 8


def aligned_bias(call: AttentionCall) -> tuple:
    """Additive bias ``(B, Hq, Sq, Skv)`` in the query dtype (``-inf`` where masked, empty rows unmasked), carved
    from an 8-aligned buffer as xformers' HINT asks, and the rows to zero afterwards."""
    keep = call.keep_mask()
    safe_keep, row_has_key = unmask_empty_rows(keep)
    padded = math.ceil(call.key_len / BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    buffer = torch.zeros((call.batch, call.heads, call.q_len, padded), dtype=call.dtype, device=call.device)
    bias = buffer[..., : call.key_len]
    if call.mask is not None and call.mask.bias is not None:
        bias.copy_(call.mask.bias.to(call.dtype).masked_fill(~row_has_key, 0.0).expand_as(bias))
    bias.masked_fill_(~safe_keep, float("-inf"))
    return bias, row_has_key


@register_kernel
class XformersKernel(Kernel):
    """xformers.ops.memory_efficient_attention with SDPA semantics (layout, masks, causal, GQA)."""

    name = "xformers"
    summary = "xformers.ops.memory_efficient_attention (BMHK layout, additive biases)"
    priority = 40
    default_selection = False
    listing_order = 60
    package = "xformers"
    device_types = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32)

    def device_reasons(self) -> List[Reason]:
        if backend_status("cuda").available:  # not torch.cuda.is_available(): transfer_to_npu makes it lie
            return []
        return [
            Reason(
                "no-device", "xformers is installed but no CUDA device is visible (torch.cuda.is_available() is False)"
            )
        ]

    def run(self, call: AttentionCall) -> Tensor:
        xops = self._ops()
        attn_bias: Optional[object] = None
        row_has_key = None
        if call.mask is not None:
            attn_bias, row_has_key = aligned_bias(call)
        elif call.is_causal:
            attn_bias = xops.LowerTriangularMask()
        query = call.query.transpose(1, 2)  # (B, Sq, Hq, D)
        key = call.key.transpose(1, 2)
        value = call.value.transpose(1, 2)
        if call.group > 1:  # BMGHK: G = key/value heads, H = query heads per key/value head
            batch, q_len, key_len = call.batch, call.q_len, call.key_len
            query = query.reshape(batch, q_len, call.kv_heads, call.group, call.head_dim)
            key = key[:, :, :, None].expand(batch, key_len, call.kv_heads, call.group, call.head_dim)
            value = value[:, :, :, None].expand(batch, key_len, call.kv_heads, call.group, call.value_dim)
            if isinstance(attn_bias, Tensor):
                attn_bias = attn_bias.view(batch, call.kv_heads, call.group, q_len, key_len)
        try:
            out = xops.memory_efficient_attention(
                query, key, value, attn_bias=attn_bias, p=call.dropout_p, scale=call.scale
            )
        except (NotImplementedError, ValueError) as exc:
            raise KernelRuntimeError(f"xformers refused this call ({call.describe()}):\n{exc}") from exc
        out = out.reshape(call.batch, call.q_len, call.heads, call.value_dim).transpose(1, 2)
        return zero_fully_masked_rows(out, row_has_key)

    def _ops(self):
        import importlib

        return importlib.import_module("xformers.ops")
