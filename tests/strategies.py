"""Hypothesis strategies: random attention calls in every mask form users' code produces.

A case carries the arguments as a user would pass them to ``npu_port.attention`` (the mask in one of the forms,
converted with the documented helper where the form needs one) *and* the ground truth (``keep``: True = takes
part, ``bias``: additive values) that the float64 reference reads. The two are built from the same random draw but
never from each other through npu_port code, so a conversion bug shows up as a parity failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from hypothesis import strategies as st
from torch import Tensor

from npu_port import masks

#: Mask forms found in users' code (see npu_port.attn.masks).
MASK_FORMS = (
    "none",
    "bool",  # SDPA keep-mask, (B, H|1, Sq, Skv)
    "bool_2d",  # (Sq, Skv)
    "additive_inf",  # 0 / -inf float mask
    "additive_finfo_min",  # 0 / finfo(dtype).min float mask (transformers style)
    "additive_bias",  # finite bias (ALiBi-like) with -inf where masked
    "key_padding",  # (B, Skv) 1 = valid token, via masks.keep_from_key_padding
    "legacy_batch_heads",  # (B*H, Sq, Skv) 0/finfo.min float, via masks.unfold_heads
    "ascend_masked",  # bool True = masked (Ascend polarity), via masks.keep_from_masked
    "binary_keep",  # float 0/1 keep-mask, via masks.keep_from_binary
)

#: Forms whose float values could carry a bias: Ascend and flash kernels must refuse them as given.
FLOAT_FORMS = ("additive_inf", "additive_finfo_min", "additive_bias", "legacy_batch_heads")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Case:
    query: Tensor
    key: Tensor
    value: Tensor
    attn_mask: Optional[Tensor]
    keep: Optional[Tensor]  # ground truth, 4-D broadcastable, True = takes part
    bias: Optional[Tensor]  # ground truth additive values (float64), broadcastable
    is_causal: bool
    scale: Optional[float]
    enable_gqa: bool
    form: str
    dtype: torch.dtype
    per_head_mask: bool = False

    def kwargs(self) -> dict:
        return dict(is_causal=self.is_causal, scale=self.scale, enable_gqa=self.enable_gqa)


def _keep(gen: torch.Generator, shape, empty_rows: bool, keep_p: float = 0.7) -> Tensor:
    keep = torch.rand(shape, generator=gen) < keep_p
    if empty_rows and shape[-2] > 0:
        rows = torch.rand(shape[:-1], generator=gen) < 0.3
        keep = keep & ~rows[..., None]
    return keep


@st.composite
def attention_cases(draw, dtypes=DTYPES, forms=MASK_FORMS, max_len: int = 20, head_dims=(1, 8, 16, 24, 32, 64)):
    dtype = draw(st.sampled_from(dtypes))
    batch = draw(st.integers(1, 3))
    kv_heads = draw(st.integers(1, 3))
    group = draw(st.sampled_from((1, 1, 2, 3)))
    heads = kv_heads * group
    q_len = draw(st.integers(1, max_len))
    key_len = draw(st.integers(1, max_len))
    head_dim = draw(st.sampled_from(head_dims))
    value_dim = draw(st.sampled_from((head_dim, head_dim, max(1, head_dim // 2))))
    form = draw(st.sampled_from(forms))
    is_causal = draw(st.booleans())
    scale = draw(st.one_of(st.none(), st.floats(0.05, 1.5)))
    empty_rows = draw(st.booleans())
    per_head = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)

    query = torch.randn(batch, heads, q_len, head_dim, generator=gen).to(dtype)
    key = torch.randn(batch, kv_heads, key_len, head_dim, generator=gen).to(dtype)
    value = torch.randn(batch, kv_heads, key_len, value_dim, generator=gen).to(dtype)

    mask_heads = heads if per_head else 1
    attn_mask = keep = bias = None
    if form == "bool":
        keep = _keep(gen, (batch, mask_heads, q_len, key_len), empty_rows)
        attn_mask = keep
    elif form == "bool_2d":
        keep = _keep(gen, (q_len, key_len), empty_rows)
        attn_mask = keep
    elif form in ("additive_inf", "additive_finfo_min"):
        keep = _keep(gen, (batch, mask_heads, q_len, key_len), empty_rows)
        fill = -math.inf if form == "additive_inf" else torch.finfo(dtype).min
        attn_mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)
    elif form == "additive_bias":
        keep = _keep(gen, (batch, mask_heads, q_len, key_len), empty_rows)
        values = (torch.randn(keep.shape, generator=gen) * 2).to(dtype)
        attn_mask = values.masked_fill(~keep, -math.inf)
        bias = values.double().masked_fill(~keep, 0.0)
    elif form == "key_padding":
        padding = (torch.rand(batch, key_len, generator=gen) < 0.7).long()
        if empty_rows:
            padding[0] = 0  # a whole batch item with no valid key: every one of its rows is empty
        keep = padding.bool()[:, None, None, :]
        attn_mask = masks.keep_from_key_padding(padding)
    elif form == "legacy_batch_heads":
        flat = _keep(gen, (batch * heads, q_len, key_len), empty_rows)
        legacy = torch.zeros(flat.shape, dtype=dtype).masked_fill(~flat, torch.finfo(dtype).min)
        attn_mask = masks.unfold_heads(legacy, heads=heads)
        keep = flat.reshape(batch, heads, q_len, key_len)
    elif form == "ascend_masked":
        keep = _keep(gen, (batch, mask_heads, q_len, key_len), empty_rows)
        attn_mask = masks.keep_from_masked(~keep)
    elif form == "binary_keep":
        keep = _keep(gen, (batch, mask_heads, q_len, key_len), empty_rows)
        attn_mask = masks.keep_from_binary(keep.to(dtype))
    per_head_forms = ("bool", "additive_inf", "additive_finfo_min", "additive_bias", "ascend_masked", "binary_keep")
    per_head_mask = (form in per_head_forms and mask_heads > 1) or (form == "legacy_batch_heads" and heads > 1)
    enable_gqa = group > 1 or draw(st.booleans())
    return Case(
        query, key, value, attn_mask, keep, bias, is_causal, scale, enable_gqa, form, dtype, per_head_mask=per_head_mask
    )
