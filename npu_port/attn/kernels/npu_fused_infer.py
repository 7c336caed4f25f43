"""``npu_fused_infer``: Ascend's ``torch_npu.npu_fused_infer_attention_score``, the documented inference op.

It unifies PromptFlashAttention (q_len > 1) and IncreFlashAttention (q_len == 1). Docs: float16 / bfloat16 only,
head_dim up to 512 and a multiple of 16 when q_len > 1, up to 256 heads with a GQA ratio up to 64, no dropout, no
backward, masks ``(B|1, 1, Sq, Skv)`` only (no per-head masks). With q_len == 1 the op ignores ``sparse_mode``, so a
causal single-query call gets an explicit mask (top-left causal: that query sees key 0 only). A pure float mask
becomes the op's bool mask, and a key-padding mask (each batch item's kept keys a prefix) becomes
``actual_seq_lengths_kv`` with no mask at all — with the compressed causal mask and ``sparse_mode=2`` when causal
(see :mod:`._ascend`).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ...reasons import Reason
from ..call import AttentionCall
from ..registry import register_kernel
from . import _ascend
from .base import zero_fully_masked_rows


@register_kernel
class NpuFusedInferKernel(_ascend.AscendKernel):
    """torch_npu.npu_fused_infer_attention_score (inference only) with SDPA semantics."""

    name = "npu_fused_infer"
    summary = "Ascend torch_npu.npu_fused_infer_attention_score (inference; PFA/IFA unified)"
    priority = 70
    default_selection = True
    listing_order = 50
    device_types = ("npu",)
    dtypes = (torch.float16, torch.bfloat16)
    max_head_dim = 512
    supports_dropout = False
    supports_grad = False
    supports_lse = True  # softmax_lse_flag=True
    op = "npu_fused_infer_attention_score"
    pse_note = _ascend.FIA_PSE_NOTE
    per_head_masks = False  # (B|1, 1, Sq, Skv) masks only
    key_lengths = True  # actual_seq_lengths_kv

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        op = self.op
        incremental = call.q_len == 1
        found = _ascend.limit_reasons(
            call,
            op,
            max_heads=256,
            max_group=64,
            max_batch=65536,
            max_seq=262144 if incremental else 20 * 1024 * 1024,
        )
        if call.value_dim != call.head_dim:
            found.append(
                Reason(
                    "head-dim",
                    f"value head_dim {call.value_dim} != key head_dim {call.head_dim} ({op} needs them equal)",
                )
            )
        if not incremental and call.head_dim % 16:
            found.append(
                Reason(
                    "head-dim",
                    f"head_dim {call.head_dim} is not a multiple of 16 ({op} needs 16-aligned head_dim for "
                    "float16/bfloat16 when q_len > 1)",
                )
            )
        if call.mask is not None and call.mask.per_head:
            found.append(
                Reason(
                    "mask",
                    f"per-head mask {call.mask.shape}: {op} takes (batch|1, 1, q_len, key_len) masks only",
                )
            )
        return found

    def run(self, call: AttentionCall) -> Tensor:
        return self._run(call, lse_flag=False)[0]

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """``softmax_lse_flag=True``: the op's float32 ``(B, N, Sq, 1)`` log-sum-exp."""
        out, lse, row_has_key = self._run(call, lse_flag=True)
        return out, _ascend.no_key_lse(lse[..., 0], row_has_key)

    def _run(self, call: AttentionCall, lse_flag: bool) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        torch_npu = self.package_status().module
        mask = self.op_mask(call)
        row_has_key, sparse_mode = mask.row_has_key, mask.sparse_mode
        out, lse = torch_npu.npu_fused_infer_attention_score(
            call.query.contiguous(),
            call.key.contiguous(),
            call.value.contiguous(),
            atten_mask=mask.atten_mask,
            actual_seq_lengths_kv=None if mask.kv_lengths is None else list(mask.kv_lengths),
            num_heads=call.heads,
            num_key_value_heads=call.kv_heads,
            scale=call.scale,
            pre_tokens=_ascend.NO_BAND_LIMIT,
            next_tokens=_ascend.NO_BAND_LIMIT,
            input_layout="BNSD",
            sparse_mode=sparse_mode,
            inner_precise=0,
            **({"softmax_lse_flag": True} if lse_flag else {}),
        )
        return zero_fully_masked_rows(out, row_has_key), lse, row_has_key
