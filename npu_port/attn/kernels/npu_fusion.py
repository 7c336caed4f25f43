"""``npu_fusion``: Ascend's ``torch_npu.npu_fusion_attention`` (FlashAttentionScore), the op with a backward.

Layout BNSD passes straight through (no transposes); grouped-query attention is native; dropout becomes
``keep_prob``; causal goes through the compressed mask and ``sparse_mode=2`` instead of being dropped, as diffusers'
``_native_npu`` backend drops it. A pure float mask becomes the op's bool mask (see :mod:`._ascend`); key padding
stays a full ``(B, 1, Sq, Skv)`` mask here, since this op takes key lengths only in its TND (varlen) layout. A bias
(T5's relative positions, ALiBi) goes to ``pse`` with ``scale=1`` and the query pre-scaled, the one case in which
the docs' two formulas for pse agree (see :mod:`._ascend`). Docs:
float16, bfloat16 and float32; head_dim 1..768 with Dk >= Dv; up to 256 query heads; batch up to 2M; sequences up
to 1M.
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
class NpuFusionKernel(_ascend.AscendKernel):
    """torch_npu.npu_fusion_attention (training + inference) with SDPA semantics."""

    name = "npu_fusion"
    summary = "Ascend torch_npu.npu_fusion_attention (FlashAttentionScore; has a backward)"
    priority = 60
    default_selection = True
    listing_order = 40
    device_types = ("npu",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    max_head_dim = 768
    supports_lse = True  # softmax_max + log(softmax_sum), without gradients (the op's statistics are detached)
    op = "npu_fusion_attention"
    pse_bias = True  # a bias goes to pse (scale=1, the query pre-scaled)
    per_head_masks = True  # BNSS masks
    key_lengths = False  # only in the TND (varlen) layout

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        found = _ascend.limit_reasons(
            call, "npu_fusion_attention", max_heads=256, max_group=None, max_batch=2 * 1024 * 1024, max_seq=1024 * 1024
        )
        if call.value_dim > call.head_dim:
            found.append(
                Reason(
                    "head-dim",
                    f"value head_dim {call.value_dim} > key head_dim {call.head_dim} "
                    "(npu_fusion_attention needs Dk >= Dv)",
                )
            )
        if call.dropout_p >= 1.0:
            found.append(
                Reason("dropout", "dropout_p=1 would be keep_prob=0; npu_fusion_attention needs keep_prob in (0, 1]")
            )
        if call.return_lse and call.needs_grad:
            found.append(
                Reason(
                    "lse",
                    "return_lse=True with gradients: npu_fusion_attention's softmax_max / softmax_sum carry no "
                    "gradient; run under torch.no_grad() or use chunked",
                )
            )
        return found

    def run(self, call: AttentionCall) -> Tensor:
        return self._outputs(call)[0]

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """lse = softmax_max + log(softmax_sum): the op's statistics are float32 ``(B, N, Sq, 8)``, one value
        repeated over the last axis (the max of the scaled masked scores, the sum of ``exp(score - max)``)."""
        out, softmax_max, softmax_sum, row_has_key = self._outputs(call)
        return out, _ascend.no_key_lse(softmax_max[..., 0] + torch.log(softmax_sum[..., 0]), row_has_key)

    def _outputs(self, call: AttentionCall) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """The output (rows with no key zeroed), the op's softmax statistics, and the rows that have a key."""
        torch_npu = self.package_status().module
        mask = self.op_mask(call)
        atten_mask, row_has_key, sparse_mode = mask.atten_mask, mask.row_has_key, mask.sparse_mode
        query, scale, pse = call.query, call.scale, mask.pse
        if pse is not None:  # scale=1: the documented formulas for pse agree (see _ascend.pse_query)
            query, scale = _ascend.pse_query(call), 1.0
        outputs = torch_npu.npu_fusion_attention(
            query.contiguous(),
            call.key.contiguous(),
            call.value.contiguous(),
            head_num=call.heads,
            input_layout="BNSD",
            pse=pse,
            atten_mask=atten_mask,
            scale=scale,
            keep_prob=1.0 - call.dropout_p,
            pre_tockens=_ascend.NO_BAND_LIMIT,
            next_tockens=_ascend.NO_BAND_LIMIT,
            sparse_mode=sparse_mode,
        )
        return zero_fully_masked_rows(outputs[0], row_has_key), outputs[1], outputs[2], row_has_key
