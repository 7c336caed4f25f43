"""The NaN-safe masked softmax shared by the ``math`` and ``chunked`` kernels.

Masked positions are filled with the compute dtype's minimum rather than ``-inf``: a row whose keys are all masked
then softmaxes to a finite uniform row instead of NaN, and is multiplied by zero afterwards, so the output and the
gradients stay finite. Half-precision scores are softmaxed in float32 (float64 stays float64), so an additive
float16 ``finfo.min`` mask cannot overflow to ``-inf``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def upcast_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 / bfloat16 (and float32) compute in float32; float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_softmax(scores: Tensor, bias: Optional[Tensor], keep: Optional[Tensor], inplace: bool) -> Tensor:
    """Softmax over the last dimension of ``scores + bias`` restricted to ``keep``, in float32 (float64 for float64
    scores); rows with no key give 0.

    ``inplace`` (allowed when autograd is off) reuses the score buffer for the result, so only one score-sized
    tensor is alive at a time.
    """
    compute = upcast_dtype(scores.dtype)
    if scores.dtype != compute:
        scores = scores.to(compute)
    if bias is not None:
        bias = bias.to(compute)
        scores = scores.add_(bias) if inplace else scores + bias
    if keep is not None:
        lowest = torch.finfo(compute).min
        scores = scores.masked_fill_(~keep, lowest) if inplace else scores.masked_fill(~keep, lowest)
    if inplace:
        scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
        probs = scores.div_(scores.sum(dim=-1, keepdim=True))
    else:
        probs = torch.softmax(scores, dim=-1)
    if keep is None:
        return probs
    row_has_key = keep.any(dim=-1, keepdim=True)
    return probs.mul_(row_has_key) if inplace else probs * row_has_key


def softmax_with_lse(scores: Tensor, bias: Optional[Tensor], keep: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``(probs, lse)`` of ``scores + bias`` restricted to ``keep``, in float32 (float64 for float64): the
    probabilities as :func:`masked_softmax` gives them (0 in rows with no key) and the ``(..., Sq)`` log-sum-exp
    (``-inf`` in rows with no key). Out of place: the lse path is the one ring attention differentiates through."""
    compute = upcast_dtype(scores.dtype)
    scores = scores.to(compute)
    if bias is not None:
        scores = scores + bias.to(compute)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # -inf where a row has no key
    finite = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - finite)  # exp(-inf) = 0 in masked places and in rows with no key
    return probs, lse.squeeze(-1)
