"""A stand-in for MindIE-SD's ``mindiesd.layernorm_scale_shift`` that enforces its documented contract, on the CPU.

This is not MindIE-SD. It follows the function's documentation (``Ascend/MindIE-SD`` ``docs/en/features/
core_layers.md``: "Computation formula: ``out = layernorm(x) * (1 + scale) + shift``"; ``layernorm`` a
``torch.nn.LayerNorm`` instance; ``x`` "3D, layout ``[B,S,H]``"; ``scale`` / ``shift`` "2D ``[B,H]`` or 3D
``[B,1,H]``"; "The last dimension of ``x`` must equal the last dimensions of ``scale`` and ``shift``"; "If ``scale``
or ``shift`` is a 3D tensor, the second dimension must be 1") and the checks of ``mindiesd/layers/adalayernorm.py``
(``check_input_params``: ``fused`` must be a bool). With ``fused=True`` it computes through :func:`adaln`, the
stand-in of the custom op ``torch.ops.mindiesd.adaln`` (x, scale, shift, the LayerNorm's weight / bias when it has
them, its eps), in float64 cast once to x's dtype; ``fused=False`` is MindIE-SD's torch path, verbatim in meaning.
"""

from __future__ import annotations

import importlib.machinery
import types
from typing import Optional

import torch
from torch import nn


class ParametersInvalid(ValueError):
    """MindIE-SD's error for bad arguments (``mindiesd.utils.ParametersInvalid``)."""


def _check(layernorm, x, scale, shift, fused) -> None:
    if not isinstance(layernorm, nn.LayerNorm):
        raise ParametersInvalid(f"The type of input layernorm must be torch.nn.LayerNorm, but got {type(layernorm)}.")
    for name, value in (("x", x), ("scale", scale), ("shift", shift)):
        if not isinstance(value, torch.Tensor):
            raise ParametersInvalid(f"The data type of input {name} must be torch.Tensor, but got {type(value)}.")
    if not isinstance(fused, bool):
        raise ParametersInvalid(f"The data type of input fused must be bool, but got {type(fused)}.")
    if x.dim() != 3:
        raise ParametersInvalid(f"The dimensional of input x must be a 3, but got {x.dim()}.")
    for name, value in (("scale", scale), ("shift", shift)):
        if value.dim() not in (2, 3):
            raise ParametersInvalid(f"The dimensional of input {name} must be a 2 or 3, but got {value.dim()}.")
        if value.dim() == 3 and value.shape[1] != 1:
            raise ParametersInvalid(
                f"If {name} is a 3D tensor, the second dimension must be 1, but got {value.shape[1]}."
            )
    if not x.shape[-1] == scale.shape[-1] == shift.shape[-1]:
        raise ParametersInvalid(
            f"The last dimensions of x, scale and shift must be equal, got {x.shape[-1]}, {scale.shape[-1]}, "
            f"{shift.shape[-1]}."
        )


def adaln(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    epsilon: float = 1e-5,
) -> torch.Tensor:
    """The op: LayerNorm over the last axis (with the LayerNorm's affine when given), then ``* (1 + scale) + shift``."""
    x64 = x.to(torch.float64)
    mean = x64.mean(dim=-1, keepdim=True)
    var = (x64 - mean).pow(2).mean(dim=-1, keepdim=True)
    normed = (x64 - mean) * torch.rsqrt(var + epsilon)
    if weight is not None:
        normed = normed * weight.to(torch.float64)
    if bias is not None:
        normed = normed + bias.to(torch.float64)
    scale64, shift64 = scale.to(torch.float64), shift.to(torch.float64)
    if scale64.dim() == 2:
        scale64 = scale64[:, None]
    if shift64.dim() == 2:
        shift64 = shift64[:, None]
    return (normed * (1 + scale64) + shift64).to(x.dtype)


def layernorm_scale_shift(layernorm, x, scale, shift, fused=True):
    """``out = layernorm(x) * (1 + scale) + shift``, checked as MindIE-SD checks it."""
    _check(layernorm, x, scale, shift, fused)
    if fused:
        weight = layernorm.weight if layernorm.elementwise_affine else None
        bias = layernorm.bias if layernorm.elementwise_affine else None
        return adaln(x, scale, shift, weight, bias, layernorm.eps)
    if scale.dim() == 2:
        scale = scale[:, None]
    if shift.dim() == 2:
        shift = shift[:, None]
    return layernorm(x) * (1 + scale) + shift


def build_module() -> types.ModuleType:
    """A fresh module named ``mindiesd`` with ``layernorm_scale_shift``; put it in ``sys.modules["mindiesd"]``."""
    module = types.ModuleType(
        "mindiesd",
        "FAKE of MindIE-SD for npu-port's tests (tests/fakes/mindiesd_fake.py): layernorm_scale_shift only.",
    )
    module.__spec__ = importlib.machinery.ModuleSpec("mindiesd", None)
    module.__version__ = "3.1.0"
    module.NPU_PORT_FAKE = True
    module.layernorm_scale_shift = layernorm_scale_shift
    module.ParametersInvalid = ParametersInvalid
    module.adaln = adaln
    return module
