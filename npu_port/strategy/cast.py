"""Running a kernel in another dtype: the ``compute_dtype`` option, as a kernel of its own.

The Ascend fused ops (and flash_attn) take float16/bfloat16 only, so a float32 model would never reach them. With
``compute_dtype: float16`` a strategy may run such a kernel on inputs cast down, and cast the output back. This
changes precision, so it is explicit, shows in the kernel's name (``npu_fusion@float16``), and ``auto`` checks the
result against the math kernel on the original dtype like any other candidate.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..attn.call import AttentionCall
from ..attn.kernels.base import Kernel
from ..attn.masks import CanonicalMask, dtype_name
from ..attn.target import Target
from ..reasons import Reason


def _stand_in(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """A zero-memory tensor with the shape, device and grad flag of ``tensor`` in ``dtype`` (for cheap reasons()).
    Its values are meaningless: a float mask's stand-in keeps the caller's mask as its ``origin``, which is what the
    kernels that read mask values read."""
    scalar = torch.empty((), dtype=dtype, device=tensor.device).requires_grad_(tensor.requires_grad)
    return scalar.expand(tensor.shape)


def stand_in_call(call: AttentionCall, dtype: torch.dtype) -> AttentionCall:
    """What ``call`` would look like cast to ``dtype``, without copying any data."""
    mask = call.mask
    if mask is not None and mask.bias is not None:
        mask = CanonicalMask(mask.keep, _stand_in(mask.bias, dtype), origin=mask.source)
    return replace(
        call,
        query=_stand_in(call.query, dtype),
        key=_stand_in(call.key, dtype),
        value=_stand_in(call.value, dtype),
        mask=mask,
    )


def cast_call(call: AttentionCall, dtype: torch.dtype) -> AttentionCall:
    mask = call.mask
    if mask is not None and mask.bias is not None:
        mask = CanonicalMask(mask.keep, mask.bias.to(dtype), origin=mask.source)
    return replace(call, query=call.query.to(dtype), key=call.key.to(dtype), value=call.value.to(dtype), mask=mask)


class CastKernel(Kernel):
    """``inner`` run on the call cast to ``dtype``; the output comes back in the call's dtype."""

    def __init__(self, inner: Kernel, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype
        self.name = f"{inner.name}@{dtype_name(dtype)}"  # instance attribute: shown in explain() and reports
        self.summary = f"{inner.summary} (computed in {dtype_name(dtype)})"

    def reasons(self, call: AttentionCall, target: Optional[Target] = None) -> List[Reason]:
        if call.dtype != torch.float32:
            return [Reason("dtype", f"compute_dtype applies to float32 calls only, got {dtype_name(call.dtype)}")]
        return self.inner.reasons(stand_in_call(call, self.dtype), target)

    def availability(self) -> List[Reason]:
        return self.inner.availability()

    def score_bytes(self, call: AttentionCall) -> int:
        return self.inner.score_bytes(stand_in_call(call, self.dtype))

    def plan_bytes(self, call: AttentionCall) -> int:
        return self.inner.plan_bytes(stand_in_call(call, self.dtype))

    def fused(self, call: AttentionCall, target: Target) -> bool:
        return self.inner.fused(stand_in_call(call, self.dtype), target)

    def reads_mask_values(self, device_type: str) -> bool:
        return self.inner.reads_mask_values(device_type)

    @property
    def supports_lse(self) -> bool:  # type: ignore[override]
        return self.inner.supports_lse

    def run(self, call: AttentionCall) -> Tensor:
        return self.inner.run(cast_call(call, self.dtype)).to(call.dtype)

    def run_lse(self, call: AttentionCall) -> Tuple[Tensor, Tensor]:
        """The inner kernel's ``(out, lse)`` on the cast call; the lse is float32 whatever the compute dtype."""
        out, lse = self.inner.run_lse(cast_call(call, self.dtype))
        return out.to(call.dtype), lse

    def __repr__(self) -> str:
        return f"CastKernel({self.inner!r}, {dtype_name(self.dtype)})"
