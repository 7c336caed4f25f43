"""``adaln``: diffusers' adaptive layer norms through MindIE-SD's ``layernorm_scale_shift`` (only with ``mindiesd``).

MindIE-SD documents ``layernorm_scale_shift(layernorm, x, scale, shift, fused=True)`` as
``out = layernorm(x) * (1 + scale) + shift`` — ``layernorm`` a ``torch.nn.LayerNorm``, ``x`` 3-D ``[B,S,H]``,
``scale`` / ``shift`` ``[B,H]`` or ``[B,1,H]``, last dimensions equal — computed with ``fused=True`` by its custom op
(``torch.ops.mindiesd.adaln``, aclnnAdaLayerNorm; ``Ascend/MindIE-SD`` ``docs/en/features/core_layers.md``,
``mindiesd/layers/adalayernorm.py``). diffusers 0.42.1 computes that expression in three modules
(``models/normalization.py``), whose forwards are re-stated here with the one line replaced:

* ``AdaLayerNormZero``: ``x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]`` after
  ``emb = self.linear(self.silu(emb))`` and ``emb.chunk(6, dim=1)`` (Flux's double blocks, SD3, DiT);
* ``AdaLayerNormZeroSingle``: the same with ``chunk(3, dim=1)`` (Flux's single blocks);
* ``AdaLayerNormContinuous``: ``self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]`` after
  ``self.linear(self.silu(conditioning_embedding).to(x.dtype))`` and ``chunk(2, dim=1)`` (Flux's and SD3's
  ``norm_out``).

Only where ``self.norm`` is exactly ``torch.nn.LayerNorm`` (``FP32LayerNorm`` casts to float32 first and an RMSNorm is
another formula: reported, code ``norm-type``). The first-call check compares each with diffusers' own forward, so a
diffusers release that changes these forwards is caught rather than trusted. Wan computes its adaLN inline in
``WanTransformerBlock.forward`` (with ``FP32LayerNorm``): there is no module to replace.
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

OP = "adaln"
CLASSES = ("AdaLayerNormZero", "AdaLayerNormZeroSingle", "AdaLayerNormContinuous")


def _x_reason(x: torch.Tensor) -> Optional[str]:
    why = device_reason(x) or dtype_reason(x)
    if why is None and x.dim() != 3:
        why = f"{x.dim()}-D input: layernorm_scale_shift takes [B, S, H]"
    return why


def _zero_site(where: str, module: nn.Module, mindiesd: Any, chunks: int) -> ModuleSite:
    site = Site(OP, where, "mindiesd.layernorm_scale_shift")

    if chunks == 6:

        def eligible(x, timestep=None, class_labels=None, hidden_dtype=None, emb=None) -> Optional[str]:
            if module.emb is None and (not isinstance(emb, torch.Tensor) or emb.dim() != 2):
                return "emb is not [B, C]: scale / shift would not be [B, H]"
            return _x_reason(x)

        def fused(x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
            if module.emb is not None:
                emb = module.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
            emb = module.linear(module.silu(emb))
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
            x = mindiesd.layernorm_scale_shift(module.norm, x, scale_msa, shift_msa, fused=True)
            return x, gate_msa, shift_mlp, scale_mlp, gate_mlp

    else:

        def eligible(x, emb=None) -> Optional[str]:
            if not isinstance(emb, torch.Tensor) or emb.dim() != 2:
                return "emb is not [B, C]: scale / shift would not be [B, H]"
            return _x_reason(x)

        def fused(x, emb=None):
            emb = module.linear(module.silu(emb))
            shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
            return mindiesd.layernorm_scale_shift(module.norm, x, scale_msa, shift_msa, fused=True), gate_msa

    return ModuleSite(site, module, lambda original: FusedCall(site, original, fused, eligible))


def _continuous_site(where: str, module: nn.Module, mindiesd: Any) -> ModuleSite:
    site = Site(OP, where, "mindiesd.layernorm_scale_shift")

    def eligible(x: torch.Tensor, conditioning_embedding: torch.Tensor) -> Optional[str]:
        if conditioning_embedding.dim() != 2:
            return "conditioning_embedding is not [B, C]: scale / shift would not be [B, H]"
        return _x_reason(x)

    def fused(x: torch.Tensor, conditioning_embedding: torch.Tensor) -> torch.Tensor:
        emb = module.linear(module.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return mindiesd.layernorm_scale_shift(module.norm, x, scale, shift, fused=True)

    return ModuleSite(site, module, lambda original: FusedCall(site, original, fused, eligible))


def plan(ctx: Context) -> OpPlan:
    """Every diffusers AdaLayerNormZero / ZeroSingle / Continuous (whose forward is diffusers' own) in the target."""
    result = OpPlan(OP)
    pieces, declined = ops.find(ops.ADALN, ctx.modules, strict=ctx.strict)
    result.decline(declined)  # the adaptive norms keep diffusers' own forward
    classes = {name: pieces.get(name) for name in CLASSES}
    found = []
    for name, module in ctx.modules:
        for cls_name, cls in classes.items():
            if overrides_nothing(module, cls):
                found.append((name or type(module).__name__, module, cls_name))
                break
    if not found:
        if declined is None:
            result.notes.append("adaln: no AdaLayerNormZero / ZeroSingle / Continuous in this model")
        return result
    if ctx.mindiesd is None:
        return result.refuse_op(ctx.mindiesd_reason)
    for where, module, cls_name in found:
        norm = getattr(module, "norm", None)
        if type(norm) is not nn.LayerNorm:
            kind = type(norm).__name__
            reason = Reason(
                "norm-type", f"its norm is {kind}, not torch.nn.LayerNorm: layernorm_scale_shift computes LN"
            )
            result.refusals.append(Refusal(OP, where, reason))
        elif cls_name == "AdaLayerNormContinuous":
            result.sites.append(_continuous_site(where, module, ctx.mindiesd))
        else:
            result.sites.append(_zero_site(where, module, ctx.mindiesd, 6 if cls_name == "AdaLayerNormZero" else 3))
    return result
