"""``geglu_exact`` and ``geglu_tanh``: diffusers' ``GEGLU`` with the GELU the user chose, on every device.

diffusers 0.42.1's ``GEGLU.forward`` (``models/activations.py``) computes ``a * F.gelu(gate)`` — exact, erf GELU —
on CPU and GPU, but ``torch_npu.npu_geglu(hidden_states, dim=-1, approximate=1)[0]`` whenever
``is_torch_npu_available()`` says the package is installed. ``approximate=1`` is "tanh" ("0表示使用none，1表示使用
tanh", torch_npu 2.13.0 docs), so the same model gives different numbers on an NPU, by up to 4.7e-4 x |a| per
element (the largest gap between tanh and erf GELU, at x = -2.70), and the switch depends on the package being
installed, not on where the tensor is.

* ``geglu_exact`` keeps exact GELU: ``npu_geglu(..., approximate=0)`` on NPU tensors, the torch path elsewhere. It is
  checked against exact GELU, not against diffusers' NPU forward (which it deliberately does not match). Where
  diffusers does not take its NPU branch (``is_torch_npu_available()`` is False) GEGLU is exact already: nothing is
  patched, and the handle says so.
* ``geglu_tanh`` is the fused tanh form, only when asked: it changes numbers (the gap above) everywhere it runs,
  which the handle says; checked against tanh GELU computed by torch; it needs torch_npu.

If the fused op fails its first-call check, the replacement stays and computes through torch with the GELU asked
for: putting diffusers' forward back would switch the GELU silently (on an NPU machine it is the tanh one).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..upstream.diffusers import ops
from .backend import device_reason, dtype_reason
from .check import FusedCall, Site
from .plan import Context, ModuleSite, OpPlan, overrides_nothing

#: npu_geglu's ``approximate`` per op, and torch's name for the same GELU.
APPROXIMATE = {"geglu_exact": (0, "none"), "geglu_tanh": (1, "tanh")}
#: Said on the handle whenever geglu_tanh is installed.
TANH_NOTE = (
    "geglu_tanh: GEGLU uses tanh-approximate GELU (npu_geglu approximate=1): outputs differ from exact GELU by up "
    "to 4.7e-4 x |a| per element, on every device this model runs on"
)


def _torch_path(module: nn.Module, approximate: str) -> Callable[..., torch.Tensor]:
    """diffusers' own CPU/GPU computation, with the GELU asked for."""

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        value, gate = module.proj(hidden_states).chunk(2, dim=-1)
        return value * F.gelu(gate, approximate=approximate)

    return forward


def _site(op: str, name: str, module: nn.Module, torch_npu: Any) -> ModuleSite:
    code, approximate = APPROXIMATE[op]
    site = Site(op, name, f"torch_npu.npu_geglu(approximate={code})", keep_on_refusal=True)
    torch_path = _torch_path(module, approximate)

    def eligible(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Optional[str]:
        if torch_npu is None:
            return "torch_npu is not importable"
        return device_reason(hidden_states) or dtype_reason(module.proj.weight, "weight")

    def fused(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch_npu.npu_geglu(module.proj(hidden_states), dim=-1, approximate=code)[0]

    def build(original: Any) -> FusedCall:
        return FusedCall(site, original, fused, eligible, reference=torch_path, fallback=torch_path)

    return ModuleSite(site, module, build)


def plan(ctx: Context, op: str) -> OpPlan:
    """Every diffusers ``GEGLU`` (whose forward is diffusers' own) in the target."""
    result = OpPlan(op)
    pieces, declined = ops.find(ops.GEGLU, ctx.modules, strict=ctx.strict)
    result.decline(declined)  # GEGLU keeps diffusers' own forward
    geglu = pieces.get("GEGLU")
    found = [(name or type(m).__name__, m) for name, m in ctx.modules if overrides_nothing(m, geglu)]
    if not found:
        if declined is None:
            result.notes.append(f"{op}: no diffusers GEGLU in this model")
        return result
    if op == "geglu_tanh":
        if ctx.torch_npu is None:
            return result.refuse_op(ctx.torch_npu_reason)
        result.notes.append(TANH_NOTE)
    else:
        _, declined = ops.find(ops.GEGLU_EXACT, ctx.modules, strict=ctx.strict)
        if declined is not None:  # which GELU diffusers' GEGLU computes here is unknown: it is left as it is
            result.decline(declined)
            return result
        npu_branch = ops.current("GEGLU npu switch")  # read now: diffusers reads its module global at each call
        if not (callable(npu_branch) and npu_branch()):
            result.notes.append(
                "geglu_exact: diffusers' GEGLU already computes exact GELU here (its torch_npu branch is off: "
                "diffusers.utils.is_torch_npu_available() is False); nothing patched"
            )
            return result
        if ctx.torch_npu is None:  # diffusers will call npu_geglu; we can still keep GELU exact through torch
            result.notes.append(
                f"geglu_exact: {ctx.torch_npu_reason}; GEGLU computes exact GELU through torch instead of npu_geglu"
            )
    for name, module in found:
        result.sites.append(_site(op, name, module, ctx.torch_npu))
    return result
