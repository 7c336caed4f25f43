"""What makes two attention calls the same for a plan: a :class:`Signature`.

A model makes thousands of attention calls but only a handful of distinct ones (per layer kind, per resolution).
Everything a kernel's ``reasons`` / ``fused`` / ``plan_bytes`` can depend on is in the signature — shapes, dtype,
the mask's kind, shape and values (a float mask that is a pure 0/-inf mask is not the same question as a bias),
causality, dropout, scale, grouped-query, log-sum-exp, gradients — plus whether npu-port routed the call at all, so
calls with one signature get one answer and a count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from ..attn.call import AttentionCall
from ..attn.masks import MASKED_AT_OR_BELOW, dtype_name

#: A float mask with more distinct values than this is described as a bias, without listing them.
MAX_LISTED_VALUES = 3


def _value_text(value: float) -> str:
    if value == float("-inf"):
        return "-inf"
    if value == torch.finfo(torch.float32).min:
        return "finfo(float32).min"
    for dtype in (torch.float16, torch.bfloat16):
        if value == torch.finfo(dtype).min:
            return f"finfo({dtype_name(dtype)}).min"
    return f"{value:g}"


@dataclass(frozen=True)
class MaskForm:
    """A mask as a plan sees it: ``kind`` (``bool`` or ``float``), its canonical 4-D ``shape`` (size-1 dimensions
    broadcast), ``layout`` (``key-padding``: one row per batch over the keys; ``per-head``; ``full``: a
    ``(q_len, key_len)`` mask shared by the heads), and for a float mask ``pure`` (0 wherever a key takes part, so
    it only masks: it could be a bool mask) and ``values`` (its distinct values, e.g. ``0/-inf``, ``0/-10000``, or
    ``bias`` when there are many)."""

    kind: str
    shape: Tuple[int, ...]
    layout: str
    pure: Optional[bool] = None
    values: Optional[str] = None

    def describe(self) -> str:
        text = f"{self.kind} {self.layout} {'x'.join(str(s) for s in self.shape)}"
        if self.kind == "float":
            text += f" {self.values}" + (" (pure)" if self.pure else "")
        return text

    def to_dict(self) -> Dict[str, Any]:
        return {
            "kind": self.kind,
            "shape": list(self.shape),
            "layout": self.layout,
            "pure": self.pure,
            "values": self.values,
        }


def mask_form(call: AttentionCall) -> Optional[MaskForm]:
    """The :class:`MaskForm` of ``call``'s mask (None without one). Reads the float mask's values: a plan must tell
    a pure mask from a bias, which its shape cannot."""
    mask = call.mask
    if mask is None:
        return None
    shape = mask.shape
    if shape[1] != 1:
        layout = "per-head"
    elif shape[2] == 1:
        layout = "key-padding"
    else:
        layout = "full"
    if mask.bias is None:
        return MaskForm("bool", shape, layout)
    bias = mask.bias.detach()
    kept = bias[bias > MASKED_AT_OR_BELOW]
    pure = bool((kept == 0).all())
    distinct = torch.unique(bias.float() if bias.dtype == torch.float64 else bias)
    if distinct.numel() <= MAX_LISTED_VALUES:
        values = "/".join(_value_text(float(v)) for v in sorted(distinct.tolist(), reverse=True))
    else:
        values = "bias"
    return MaskForm("float", shape, layout, pure, values)


@dataclass(frozen=True)
class Signature:
    """Everything about one attention call that decides how it runs, hashable; ``routed``: whether npu-port's
    strategy got it (False: a direct ``F.scaled_dot_product_attention`` that no integration routes — torch's, or on
    an NPU torch_npu's, own SDPA runs it)."""

    query: Tuple[int, ...]
    key: Tuple[int, ...]
    value: Tuple[int, ...]
    dtype: str
    mask: Optional[MaskForm]
    causal: bool
    dropout_p: float
    scale: float
    gqa: bool
    lse: bool
    grad: bool
    routed: bool

    @classmethod
    def of(cls, call: AttentionCall, routed: bool) -> "Signature":
        return cls(
            query=tuple(call.query.shape),
            key=tuple(call.key.shape),
            value=tuple(call.value.shape),
            dtype=dtype_name(call.dtype),
            mask=mask_form(call),
            causal=call.is_causal,
            dropout_p=call.dropout_p,
            scale=call.scale,
            gqa=call.heads != call.kv_heads,
            lse=call.return_lse,
            grad=call.needs_grad,
            routed=routed,
        )

    @property
    def default_scale(self) -> bool:
        return math.isclose(self.scale, 1.0 / math.sqrt(self.query[-1]), rel_tol=1e-6)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "shapes": {"query": list(self.query), "key": list(self.key), "value": list(self.value)},
            "dtype": self.dtype,
            "mask": self.mask.to_dict() if self.mask is not None else None,
            "causal": self.causal,
            "dropout_p": self.dropout_p,
            "scale": self.scale,
            "gqa": self.gqa,
            "lse": self.lse,
            "grad": self.grad,
            "routed": self.routed,
        }
