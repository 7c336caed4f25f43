"""The float64 reference every kernel is checked against, written from SDPA's documented semantics.

It shares no code with npu_port: a mask is given as ground truth (``keep``: True = the key takes part, and an
optional additive ``bias``), causality is top-left (``tril``), grouped-query heads are repeated with
``repeat_interleave``, and a query row with no key gives zeros (npu-port's one addition to SDPA's contract).
NaN in the inputs follows the formula: masked positions are added as ``-inf`` (so a masked NaN key still gives
NaN) and ``0 * NaN`` in the product with ``v`` is NaN; only rows with no key are zeros whatever the inputs hold.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor


def reference_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    keep: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
) -> Tensor:
    """Attention in float64 for 4-D ``(B, H, S, D)`` inputs; differentiable (for gradient parity)."""
    q, k, v = query.double(), key.double(), value.double()
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.double()
    q_len, key_len = scores.shape[-2:]
    allowed = torch.ones(q_len, key_len, dtype=torch.bool)
    if is_causal:
        allowed = allowed.tril()
    if keep is not None:
        allowed = allowed & keep
    allowed = allowed.expand(scores.shape)
    has_key = allowed.any(dim=-1, keepdim=True)
    # Masked positions are *added* as -inf, as SDPA's documented formula does: a NaN score stays NaN there.
    scores = scores + torch.zeros_like(scores).masked_fill(~allowed, -math.inf)
    scores = scores.masked_fill(~has_key, 0.0)
    probs = torch.softmax(scores, dim=-1) * has_key
    return (probs @ v).masked_fill(~has_key, 0.0)


#: Agreement with the float64 reference: |out - ref| <= atol + rtol * |ref|. Float32 is tight; float16/bfloat16
#: allow for scores and outputs rounded to the input dtype (as in xformers' tests).
TOLERANCES = {
    torch.float32: (3e-5, 1e-4),
    torch.float64: (1e-10, 1e-10),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def assert_close_to_reference(
    out: Tensor, ref: Tensor, dtype: torch.dtype, what: str = "output", extra_atol: float = 0.0
) -> None:
    """Fail with the worst element when ``out`` is not within ``dtype``'s tolerance of ``ref``, or has NaN."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), f"{what}: NaN in the result"
    atol, rtol = TOLERANCES[dtype]
    atol += extra_atol
    err = (out.double() - ref).abs()
    allowed = atol + rtol * ref.abs()
    worst = (err - allowed).argmax()
    assert bool((err <= allowed).all()), (
        f"{what}: max |diff| {err.max().item():.3g} exceeds tolerance for {dtype} "
        f"(atol {atol}, rtol {rtol}) at flat index {worst.item()}"
    )


def reference_lse(
    query: Tensor,
    key: Tensor,
    keep: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
) -> Tensor:
    """The float64 ``(B, H, Sq)`` log-sum-exp of the scaled masked scores: ``-inf`` in a row with no key."""
    q, k = query.double(), key.double()
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.double()
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool)
    if is_causal:
        allowed = allowed.tril()
    if keep is not None:
        allowed = allowed & keep
    return torch.logsumexp(scores.masked_fill(~allowed.expand(scores.shape), -math.inf), dim=-1)
