"""npu-port's stand-in for ``xformers.ops.fmha``: ``memory_efficient_attention`` computed by ``npu_port.attention``.

Layouts as in xformers: BMHK ``(batch, seq, heads, K)``, BMK ``(batch, seq, K)`` (one head; a tensor bias is then
``(batch, q_len, key_len)``) and BMGHK ``(batch, seq, groups, heads, K)`` (grouped-query attention: key/value
expanded over ``heads``). ``attn_bias``: None, an additive float tensor broadcastable to ``(B, H, q_len, key_len)``
(0 = keep, -inf = masked; unlike xformers, any shape that broadcasts and any float dtype is accepted, and cast to the
query's dtype), or one of the classes of :mod:`npu_port.dropins.xformers_attn_bias_impl`. ``p`` is the dropout
probability, ``scale`` defaults to ``1 / sqrt(K)``. ``op`` only picks a CUDA kernel in xformers: it is accepted and
ignored (npu-port's active attention strategy picks the kernel). A query row with no key gives zeros.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ..errors import AttentionInputError, DropInError
from . import xformers_attn_bias_impl as attn_bias
from ._attention import attend_bshd
from .finder import LOGGER_NAME
from .install import XFORMERS_CALLS
from .xformers_attn_bias_impl import (
    AttentionBias,
    BlockDiagonalCausalFromBottomRightMask,
    BlockDiagonalCausalMask,
    BlockDiagonalMask,
    LocalAttentionFromBottomRightMask,
    LowerTriangularFromBottomRightMask,
    LowerTriangularMask,
    LowerTriangularMaskWithTensorBias,
)

logger = logging.getLogger(LOGGER_NAME)

Bias = Union[None, Tensor, AttentionBias]

__all__ = [
    "AttentionBias",
    "AttentionBwOpBase",
    "AttentionFwOpBase",
    "AttentionOpBase",
    "BlockDiagonalCausalFromBottomRightMask",
    "BlockDiagonalCausalMask",
    "BlockDiagonalMask",
    "LocalAttentionFromBottomRightMask",
    "LowerTriangularFromBottomRightMask",
    "LowerTriangularMask",
    "LowerTriangularMaskWithTensorBias",
    "MemoryEfficientAttentionCutlassFwdFlashBwOp",
    "MemoryEfficientAttentionCutlassOp",
    "MemoryEfficientAttentionFlashAttentionOp",
    "attn_bias",
    "memory_efficient_attention",
    "memory_efficient_attention_forward",
]


class AttentionOpBase:
    """Stands for xformers' kernel classes, which code passes as ``op=`` / diffusers' ``attention_op=``. npu-port
    ignores them: the active attention strategy picks the kernel."""

    NAME = "npu_port"


class AttentionFwOpBase(AttentionOpBase):
    pass


class AttentionBwOpBase(AttentionOpBase):
    pass


class _FlashFwOp(AttentionFwOpBase):
    NAME = "flshattF"


class _FlashBwOp(AttentionBwOpBase):
    NAME = "flshattB"


class _CutlassFwOp(AttentionFwOpBase):
    NAME = "cutlassF"


class _CutlassBwOp(AttentionBwOpBase):
    NAME = "cutlassB"


MemoryEfficientAttentionFlashAttentionOp = (_FlashFwOp, _FlashBwOp)
MemoryEfficientAttentionCutlassOp = (_CutlassFwOp, _CutlassBwOp)
MemoryEfficientAttentionCutlassFwdFlashBwOp = (_CutlassFwOp, _FlashBwOp)


@XFORMERS_CALLS.counts_calls
def memory_efficient_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_bias: Bias = None,
    p: float = 0.0,
    scale: Optional[float] = None,
    *,
    op: object = None,
    output_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """xformers' ``memory_efficient_attention`` (see the module docstring); returns the query's layout with the
    value's last dimension, in ``output_dtype`` when given."""
    if op is not None:
        logger.debug("npu-port xformers drop-in: op=%r ignored (the active attention strategy picks the kernel)", op)
    ndim = query.dim()
    if not (ndim == key.dim() == value.dim()) or ndim not in (3, 4, 5):
        raise AttentionInputError(
            "query, key and value must all be BMK (batch, seq, K), BMHK (batch, seq, heads, K) or BMGHK (batch, seq, "
            f"groups, heads, K); got shapes {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if ndim == 3:
        bias = _map_tensor_bias(attn_bias, lambda t: t.reshape((1,) * (3 - t.dim()) + tuple(t.shape)).unsqueeze(1))
        out = _attend_bmhk(query[:, :, None], key[:, :, None], value[:, :, None], bias, p, scale)[:, :, 0]
    elif ndim == 5:
        out = _attend_bmghk(query, key, value, attn_bias, p, scale)
    else:
        out = _attend_bmhk(query, key, value, attn_bias, p, scale)
    return out if output_dtype is None else out.to(output_dtype)


@XFORMERS_CALLS.counts_calls
def memory_efficient_attention_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_bias: Bias = None,
    p: float = 0.0,
    scale: Optional[float] = None,
    *,
    op: object = None,
    output_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """Same as :func:`memory_efficient_attention` (xformers' forward-only entry point)."""
    return memory_efficient_attention(query, key, value, attn_bias, p, scale, op=op, output_dtype=output_dtype)


def _map_tensor_bias(bias: Bias, change: Callable[[Tensor], Tensor]) -> Bias:
    """Apply a layout change to the tensor part of a bias (a tensor, or the tensor of a causal-with-bias mask)."""
    if isinstance(bias, LowerTriangularMaskWithTensorBias):
        return LowerTriangularMaskWithTensorBias(change(bias._bias))
    if isinstance(bias, Tensor):
        return change(bias)
    return bias


def _attend_bmghk(query: Tensor, key: Tensor, value: Tensor, bias: Bias, p: float, scale: Optional[float]) -> Tensor:
    """BMGHK -> BMHK with ``G * H`` query heads; key/value expanded over H (the usual GQA form) become G shared heads
    instead of being copied."""
    batch, q_len, groups, heads, _ = query.shape
    if key.shape[3] == 1 or (key.stride(3) == 0 and value.stride(3) == 0):
        key, value = key[:, :, :, 0], value[:, :, :, 0]
    else:
        key, value = key.flatten(2, 3), value.flatten(2, 3)

    def fold_heads(t: Tensor) -> Tensor:  # (B, G, H, Mq, Mk) broadcastable -> (B, G*H | 1, Mq, Mk)
        t = t.reshape((1,) * (5 - t.dim()) + tuple(t.shape))
        if t.shape[1] == 1 and t.shape[2] == 1:
            return t[:, :, 0]
        return t.expand(t.shape[0], groups, heads, t.shape[3], t.shape[4]).flatten(1, 2)

    out = _attend_bmhk(query.flatten(2, 3), key, value, _map_tensor_bias(bias, fold_heads), p, scale)
    return out.unflatten(2, (groups, heads))


def _attend_bmhk(query: Tensor, key: Tensor, value: Tensor, bias: Bias, p: float, scale: Optional[float]) -> Tensor:
    if bias is None:
        return attend_bshd(query, key, value, dropout_p=p, scale=scale)
    if isinstance(bias, Tensor):
        if not bias.dtype.is_floating_point:
            raise AttentionInputError(
                f"attn_bias must be an additive float tensor (0 = keep, -inf = masked), as in xformers; got "
                f"{str(bias.dtype).replace('torch.', '')}. Convert a bool keep-mask with "
                "npu_port.masks.additive_from_keep(mask, dtype=query.dtype)"
            )
        return attend_bshd(query, key, value, bias.to(query.dtype), dropout_p=p, scale=scale)
    if isinstance(bias, AttentionBias):
        return bias._attend(query, key, value, p, scale)
    supported = ", ".join(name for name in __all__ if name.endswith("Mask") or name.endswith("TensorBias"))
    raise DropInError(
        f"attn_bias of type {type(bias).__name__} is not supported by npu-port's xformers drop-in; it takes None, "
        f"an additive float tensor, or one of: {supported}"
    )
