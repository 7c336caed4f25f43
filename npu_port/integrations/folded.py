"""Attention on heads folded into the batch: ``(batch*heads, seq, dim)`` tensors, an additive mask, ``scale`` and
the upcast flags read from the module — through one SDPA-style attention function.

Two callers compute exactly this: the legacy attention methods of old diffusers copies
(:mod:`npu_port.integrations.legacy_attention`) and today's diffusers processors that pair
``attn.get_attention_scores(query, key, mask)`` with ``torch.bmm(probs, value)`` (``AttnProcessor``, sliced,
added-KV, custom-diffusion, IP-Adapter: :mod:`npu_port.integrations.diffusers.scores`). Both need the same unfolding
with the module's ``heads``, the same mask conversion and the same dtype promotion, so it lives here once.

Numerics: ``upcast_attention`` / ``upcast_softmax`` compute the whole call in float32 (the original upcasts the scores
only; the routed result is at least as accurate), and mixed dtypes are promoted as the original's additions promote
them. An additive value at or below ``npu_port.masks.MASKED_AT_OR_BELOW`` (``-inf``, ``finfo.min``) masks the key;
-10000-style masks are added as they are. The one intended difference: a query row whose keys are all masked gives
zeros where the original gives NaN (``-inf``) or an average over the masked keys (``finfo.min``). A call outside these
forms (an integer or bool mask, a mask that is not ``(batch*heads | 1, q_len | 1, key_len)``, key/value batches that
differ from the query's) is :data:`UNFIT`: the caller runs the original code for it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ..attn import masks
from ..attn.api import attention

#: What :func:`attend` returns for a call outside the folded forms (the caller runs the original instead).
UNFIT = object()

#: ``attention_fn(query, key, value, attn_mask, scale=...)`` on ``(B, H, S, D)`` tensors, SDPA semantics.
FoldedAttentionFn = Callable[..., Tensor]


def compute_dtype(module: Any, *tensors: Optional[Tensor]) -> torch.dtype:
    """The dtype the original's arithmetic ends up in: promoted across inputs (and mask), float32 if upcasting."""
    present = [t for t in tensors if t is not None]
    dtype = present[0].dtype
    for tensor in present[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    if getattr(module, "upcast_attention", False) or getattr(module, "upcast_softmax", False):
        dtype = torch.promote_types(dtype, torch.float32)
    return dtype


def fold_mask(mask: Optional[Tensor], batch_heads: int, heads: int, q_len: int, key_len: int) -> Any:
    """A folded additive mask as a float mask for ``(batch, heads, q_len, key_len)`` scores, or :data:`UNFIT`.

    ``(batch*heads, q_len|1, key_len)`` -> ``(batch, heads, q_len|1, key_len)``; a leading 1 and 1-D / 2-D masks
    broadcast as they did against the original's 3-D scores.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or not mask.dtype.is_floating_point or not 1 <= mask.dim() <= 3:
        return UNFIT
    if mask.shape[-1] not in (1, key_len) or (mask.dim() >= 2 and mask.shape[-2] not in (1, q_len)):
        return UNFIT
    if mask.dim() < 3:
        return mask
    if mask.shape[0] == batch_heads:
        return masks.unfold_heads(mask, heads)
    if mask.shape[0] == 1:
        return mask.unsqueeze(0)
    return UNFIT


def attend(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    attention_fn: FoldedAttentionFn = attention,
) -> Any:
    """Folded ``(batch*heads, seq, dim)`` attention through ``attention_fn`` (default ``npu_port.attention``, the
    process-wide strategy), with ``module.scale``: ``(batch*heads, q_len, value_dim)`` in the compute dtype, or
    :data:`UNFIT` for a call the original must run."""
    if not all(isinstance(t, Tensor) and t.dim() == 3 for t in (query, key, value)):
        return UNFIT
    batch_heads, q_len, key_len = query.shape[0], query.shape[1], key.shape[1]
    if key.shape[0] != batch_heads or value.shape[:2] != key.shape[:2]:
        return UNFIT
    heads = getattr(module, "heads", 1)
    if not isinstance(heads, int) or heads < 1 or batch_heads % heads:
        heads = 1  # unusual folding (a slice of batch*heads, say): every row its own batch entry — same result
    mask = fold_mask(attention_mask, batch_heads, heads, q_len, key_len)
    if mask is UNFIT:
        return UNFIT
    dtype = compute_dtype(module, query, key, value, mask)
    q, k, v = (t.to(dtype).reshape(batch_heads // heads, heads, t.shape[1], t.shape[2]) for t in (query, key, value))
    out = attention_fn(q, k, v, None if mask is None else mask.to(dtype), scale=module.scale)
    return out.reshape(batch_heads, q_len, value.shape[-1])
