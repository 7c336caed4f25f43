"""The two matrix products of attention, with grouped-query heads folded in instead of copied.

Grouped-query attention shares each key/value head across ``G = Hq // Hkv`` query heads. Instead of
``repeat_interleave`` (a G-fold copy of K and V), the query is viewed as ``(B*Hkv, G*Sq, D)``: query heads
``j*G .. j*G+G-1`` line up with key head ``j`` and one ``bmm`` serves the whole group. The scores then view back as
``(B, Hq, Sq, Skv)`` for free.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def fold_query(query: Tensor, kv_heads: int) -> Tensor:
    """``(B, Hq, S, D)`` -> ``(B*Hkv, G*S, D)`` (a view when ``query`` is contiguous)."""
    batch, heads, length, dim = query.shape
    return query.reshape(batch * kv_heads, (heads // kv_heads) * length, dim)


def fold_kv(tensor: Tensor) -> Tensor:
    """``(B, Hkv, S, D)`` -> ``(B*Hkv, S, D)``."""
    batch, heads, length, dim = tensor.shape
    return tensor.reshape(batch * heads, length, dim)


def scaled_scores(
    query3: Tensor,
    key3: Tensor,
    scale: float,
    dtype: Optional[torch.dtype] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """``scale * query @ key^T`` as ``baddbmm(beta=0, alpha=scale)``: the formulation legacy code uses.

    Scaling inside the product keeps float16 scores finite where ``(q @ k^T) * scale`` overflows. The ignored
    ``input`` is a 0-d tensor broadcast by ``baddbmm``, so no second score-sized buffer is allocated. ``out`` lets a
    caller reuse one buffer across blocks (fresh large host allocations cost page faults on every block).
    """
    if dtype is not None and query3.dtype != dtype:
        query3, key3 = query3.to(dtype), key3.to(dtype)
    empty = torch.empty((), dtype=query3.dtype, device=query3.device)
    if out is not None:
        return torch.baddbmm(empty, query3, key3.transpose(1, 2), beta=0, alpha=scale, out=out)
    return torch.baddbmm(empty, query3, key3.transpose(1, 2), beta=0, alpha=scale)


def unfold_scores(scores3: Tensor, batch: int, heads: int) -> Tensor:
    """``(B*Hkv, G*Sq, X)`` -> ``(B, Hq, Sq, X)`` (always a view: the product's output is contiguous)."""
    return scores3.view(batch, heads, -1, scores3.shape[-1])


def fold_scores(scores4: Tensor, kv_heads: int) -> Tensor:
    """``(B, Hq, Sq, X)`` -> ``(B*Hkv, G*Sq, X)``, the inverse of :func:`unfold_scores`."""
    batch, heads, length, width = scores4.shape
    return scores4.reshape(batch * kv_heads, (heads // kv_heads) * length, width)
