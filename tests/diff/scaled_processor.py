"""Attention processors a custom-processor strategy file names in the diff CLI tests: the same attention as diffusers'
own (``ExactProcessor``), and one with the softmax scale doubled (``DoubledScaleProcessor``) — the defect a fused op
with a changed scale makes, which ``npu-port diff`` must find at the first attention module."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ExactProcessor:
    """Scaled dot-product attention as diffusers' ``AttnProcessor2_0`` computes it for a self- or cross-attention
    module on ``(B, N, C)`` hidden states."""

    factor = 1.0

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args, **kw):
        residual = hidden_states
        image = hidden_states.ndim == 4  # a VAE's attention: (B, C, H, W)
        if image:
            batch, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channels, height * width).transpose(1, 2)
        if getattr(attn, "group_norm", None) is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch = hidden_states.shape[0]
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        head_dim = query.shape[-1] // attn.heads
        query, key, value = (t.view(batch, -1, attn.heads, head_dim).transpose(1, 2) for t in (query, key, value))
        out = F.scaled_dot_product_attention(query, key, value, scale=self.factor * head_dim**-0.5)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        if image:
            out = out.transpose(-1, -2).reshape(batch, channels, height, width)
        if getattr(attn, "residual_connection", False):
            out = out + residual
        return out / getattr(attn, "rescale_output_factor", 1.0)


class DoubledScaleProcessor(ExactProcessor):
    factor = 2.0


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, factor: float) -> torch.Tensor:
    """The float64 attention the processors compute, for checking them."""
    q, k, v = (t.double() for t in (query, key, value))
    weights = torch.softmax(q @ k.transpose(-1, -2) * factor * q.shape[-1] ** -0.5, dim=-1)
    return weights @ v
