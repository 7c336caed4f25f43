"""``rms_norm``: diffusers' ``RMSNorm`` and ``torch.nn.RMSNorm`` through ``torch_npu.npu_rms_norm``.

The op is ``npu_rms_norm(self, gamma, epsilon=1e-06) -> (y, rstd)``: gamma is required, and "数据类型需要和self保持
一致" (the same dtype as the input); inputs are float16 / bfloat16 / float32 of 2-8 dimensions (torch_npu 2.13.0
``_op_plugin_docs.py``). So:

* a layer without a weight (``elementwise_affine=False``) keeps its own forward, reported (code ``no-weight``) —
  diffusers itself takes its torch path there;
* a weight of more than one dimension is not fused (``normalized-shape``): diffusers' RMSNorm normalises over the last
  axis only whatever its weight's shape, while the op normalises over the weight's axes;
* diffusers' RMSNorm: the input is cast to the weight's dtype first. That is diffusers' own NPU path for half
  weights, and for a float32 weight it gives what its torch path gives (float32 out: the torch path computes the
  variance in float32 and multiplies by the float32 weight); the bias, if any, is added after, as diffusers does;
* ``torch.nn.RMSNorm``: fused only when the input's dtype is the weight's (``F.rms_norm``'s own rule for mixed dtypes
  is not the op's); ``eps=None`` means ``torch.finfo(input.dtype).eps``, as in torch.

A call outside these limits (a CPU tensor, float64, a 1-D or 9-D input) runs the layer's own forward.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..reasons import Reason
from ..upstream.diffusers import ops
from .backend import device_reason, dtype_reason
from .check import FusedCall, Site
from .plan import Context, ModuleSite, OpPlan, Refusal, overrides_nothing

OP = "rms_norm"


def _shape_reason(x: torch.Tensor, features: int) -> Optional[str]:
    if not 2 <= x.dim() <= 8:  # "输入shape支持2-8维"
        return f"{x.dim()}-D input: npu_rms_norm takes 2-8 dimensions"
    if x.shape[-1] != features:
        return f"last dimension {x.shape[-1]} != weight size {features}"
    return None


def _diffusers_site(name: str, module: nn.Module, torch_npu: Any) -> ModuleSite:
    site = Site(OP, name, "torch_npu.npu_rms_norm")

    def eligible(hidden_states: torch.Tensor) -> Optional[str]:
        weight = module.weight
        return (
            device_reason(hidden_states)
            or dtype_reason(hidden_states)
            or dtype_reason(weight, "weight")
            or _shape_reason(hidden_states, weight.shape[0])
        )

    def fused(hidden_states: torch.Tensor) -> torch.Tensor:
        weight = module.weight
        out = torch_npu.npu_rms_norm(hidden_states.to(weight.dtype), weight, epsilon=module.eps)[0]
        return out + module.bias if module.bias is not None else out

    return ModuleSite(site, module, lambda original: FusedCall(site, original, fused, eligible))


def _torch_site(name: str, module: nn.RMSNorm, torch_npu: Any) -> ModuleSite:
    site = Site(OP, name, "torch_npu.npu_rms_norm")

    def eligible(x: torch.Tensor) -> Optional[str]:
        weight = module.weight
        if x.dtype != weight.dtype:
            return f"input dtype {x.dtype} != weight dtype {weight.dtype} (npu_rms_norm needs them equal)"
        return device_reason(x) or dtype_reason(x) or _shape_reason(x, weight.shape[0])

    def fused(x: torch.Tensor) -> torch.Tensor:
        eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
        return torch_npu.npu_rms_norm(x, module.weight, epsilon=eps)[0]

    return ModuleSite(site, module, lambda original: FusedCall(site, original, fused, eligible))


def plan(ctx: Context) -> OpPlan:
    """Every diffusers ``RMSNorm`` and ``torch.nn.RMSNorm`` (whose forward is the library's own) in the target."""
    result = OpPlan(OP)
    pieces, declined = ops.find(ops.RMS_NORM, ctx.modules, strict=ctx.strict)  # no diffusers layer, no lookup
    result.decline(declined)  # diffusers' RMSNorm layers keep their forward; torch's are still fused
    diffusers_rms = pieces.get("RMSNorm")
    torch_rms = getattr(nn, "RMSNorm", None)  # torch >= 2.4
    found = []
    for name, module in ctx.modules:
        if overrides_nothing(module, diffusers_rms):
            found.append((name, module, _diffusers_site))
        elif overrides_nothing(module, torch_rms):
            found.append((name, module, _torch_site))
    if not found:
        result.notes.append("rms_norm: no RMSNorm layer (diffusers' or torch's) in this model")
        return result
    if ctx.torch_npu is None:
        return result.refuse_op(ctx.torch_npu_reason)
    for name, module, make in found:
        where = name or type(module).__name__
        weight = getattr(module, "weight", None)
        if weight is None:
            reason = Reason("no-weight", "no weight (elementwise_affine=False): npu_rms_norm needs gamma; kept as is")
            result.refusals.append(Refusal(OP, where, reason))
        elif weight.dim() != 1:
            reason = Reason(
                "normalized-shape",
                f"weight of shape {tuple(weight.shape)}: only a 1-D weight (normalising the last axis) is fused",
            )
            result.refusals.append(Refusal(OP, where, reason))
        else:
            result.sites.append(make(where, module, ctx.torch_npu))
    return result
