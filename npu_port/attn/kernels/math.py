"""``math``: the ``baddbmm`` + softmax + ``bmm`` formulation that diffusers-era code uses, made NaN-safe.

It is the reference the other kernels are compared with and the "vanilla" strategy. By default half-precision
inputs are multiplied in float32 (as SDPA's own math backend does), so scores are not rounded to float16/bfloat16
before the softmax; ``upcast=False`` keeps the products in the input dtype — the exact numerics of the legacy code
(``baddbmm`` scores in the input dtype, float32 softmax, probabilities cast to the value dtype) for a port that must
reproduce them bit for bit, at the cost of score rounding that grows with the logits. Two fixes over the
hand-written versions:
masked positions are filled with float32's minimum instead of ``-inf``, so a row whose keys are all masked never
produces NaN (it is zeroed after the softmax, gradients included), and additive float16 masks are added in float32,
so ``finfo(float16).min + score`` cannot overflow to ``-inf``.

Memory is ``O(B * H * Sq * Skv)``: the score tensor is materialised. Use ``chunked`` when that does not fit.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import AttentionCall
from ..registry import register_kernel
from ._matmul import fold_kv, fold_query, fold_scores, scaled_scores, unfold_scores
from ._softmax import masked_softmax, softmax_with_lse, upcast_dtype
from .base import FromStrategy, Kernel, Option, check_bool, fp32_softmax, full_score_bytes


@register_kernel
class MathKernel(Kernel):
    """Reference attention: baddbmm + float32 softmax + bmm, NaN-safe; materialises the scores."""

    name = "math"
    summary = "reference baddbmm + float32 softmax + bmm (the 'vanilla' formulation), NaN-safe; O(Sq*Skv) memory"
    priority = 10
    default_selection = True
    listing_order = 10
    supports_lse = True
    STRATEGY_OPTIONS = {"upcast": FromStrategy("dtype_policy", fp32_softmax)}
    OPTIONS = {
        "upcast": Option(
            True,
            check_bool("upcast"),
            "multiply half-precision inputs in float32 (default, like SDPA's math backend); False keeps the legacy "
            "formulation's products in the input dtype",
        ),
    }

    def score_bytes(self, call: AttentionCall) -> int:
        product_dtype = upcast_dtype(call.dtype) if self._options["upcast"] else call.dtype
        return full_score_bytes(call, torch.empty((), dtype=product_dtype).element_size())

    def run(self, call: AttentionCall) -> Tensor:
        product_dtype = upcast_dtype(call.dtype) if self._options["upcast"] else call.dtype
        scores3 = scaled_scores(fold_query(call.query, call.kv_heads), fold_kv(call.key), call.scale, product_dtype)
        bias = call.mask.bias if call.mask is not None else None
        scores = unfold_scores(scores3, call.batch, call.heads)
        probs = masked_softmax(scores, bias, call.keep_mask(), inplace=not call.needs_grad)
        if call.dropout_p > 0:
            probs = F.dropout(probs, p=call.dropout_p, training=True)
        probs3 = fold_scores(probs.to(product_dtype), call.kv_heads)
        out3 = torch.bmm(probs3, fold_kv(call.value).to(product_dtype))
        return unfold_scores(out3, call.batch, call.heads).to(call.value.dtype)

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """:meth:`run` that also keeps the log-sum-exp of the masked scores (a separate path, so that ``run`` does no
        extra work)."""
        product_dtype = upcast_dtype(call.dtype) if self._options["upcast"] else call.dtype
        scores3 = scaled_scores(fold_query(call.query, call.kv_heads), fold_kv(call.key), call.scale, product_dtype)
        bias = call.mask.bias if call.mask is not None else None
        probs, lse = softmax_with_lse(unfold_scores(scores3, call.batch, call.heads), bias, call.keep_mask())
        if call.dropout_p > 0:
            probs = F.dropout(probs, p=call.dropout_p, training=True)
        probs3 = fold_scores(probs.to(product_dtype), call.kv_heads)
        out3 = torch.bmm(probs3, fold_kv(call.value).to(product_dtype))
        return unfold_scores(out3, call.batch, call.heads).to(call.value.dtype), lse.float()
