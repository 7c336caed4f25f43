"""npu-port's stand-in for ``xformers.ops``: ``memory_efficient_attention``, the attention-bias classes and the op
placeholders, as :mod:`npu_port.dropins.xformers_fmha_impl` defines them (``xformers.ops.fmha`` is served from there).

``unbind`` is ``torch.unbind`` (xformers' version only avoids a copy in the backward).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from . import xformers_fmha_impl as fmha
from .xformers_fmha_impl import (
    AttentionBias,
    AttentionBwOpBase,
    AttentionFwOpBase,
    AttentionOpBase,
    BlockDiagonalCausalFromBottomRightMask,
    BlockDiagonalCausalMask,
    BlockDiagonalMask,
    LocalAttentionFromBottomRightMask,
    LowerTriangularFromBottomRightMask,
    LowerTriangularMask,
    LowerTriangularMaskWithTensorBias,
    MemoryEfficientAttentionCutlassFwdFlashBwOp,
    MemoryEfficientAttentionCutlassOp,
    MemoryEfficientAttentionFlashAttentionOp,
    memory_efficient_attention,
    memory_efficient_attention_forward,
)

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
    "fmha",
    "memory_efficient_attention",
    "memory_efficient_attention_forward",
    "unbind",
]


def unbind(x: Tensor, dim: int) -> Tuple[Tensor, ...]:
    return torch.unbind(x, dim)
