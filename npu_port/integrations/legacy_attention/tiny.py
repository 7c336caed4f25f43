"""A tiny ControlVideo-style video UNet with legacy attention, built from code (no download, random seeded weights).

Written for npu-port after the structure of ControlVideo's ``UNet3DConditionModel`` (the project that pins diffusers
0.14 and whose fully-cross-frame attention allocated 112.5 GiB): SD1.5's blocks inflated over frames, where each
transformer block's self-attention is a repo-local ``FullyFrameAttention`` — a copy of diffusers 0.11's
``CrossAttention`` with heads folded into the batch, ``_attention`` computing ``baddbmm`` + softmax + ``bmm``, an
xformers switch, and every frame's queries attending to the keys of *all* frames — while its cross-attention to the
text is the diffusers ``Attention`` of the version it runs with (0.14's processor-based ``CrossAttention``; today's
``Attention``). So one model holds both kinds: the legacy routing (:mod:`npu_port.integrations.legacy_attention`)
must reach the first and the diffusers integration the second for every call to go through npu-port.

The attention shapes follow SD1.5's: 8 heads in the real model, of head dim 40, 80 and 160 per level; here 2 heads of
40 (level 1) and of 80 (level 2) keep it small. ControlVideo's pipeline passes no attention mask to its UNet.
"""

from __future__ import annotations

import torch
from torch import nn

CUDA_REQUIRED = (
    "torch.cuda.is_available() should be True but is False. xformers' memory efficient attention is only available "
    "for GPU "
)


class FullyFrameAttention(nn.Module):
    """Self-attention of every frame's tokens to the tokens of all ``video_length`` frames, heads folded into the
    batch: the legacy ``_attention(query, key, value, attention_mask=None)`` contract."""

    def __init__(self, query_dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.scale = dim_head**-0.5
        self.upcast_attention = False
        self.upcast_softmax = False
        self._use_memory_efficient_attention_xformers = False
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner_dim, query_dim), nn.Dropout(0.0)])

    def reshape_heads_to_batch_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = tensor.shape
        tensor = tensor.reshape(batch, seq, self.heads, dim // self.heads).permute(0, 2, 1, 3)
        return tensor.reshape(batch * self.heads, seq, dim // self.heads)

    def reshape_batch_dim_to_heads(self, tensor: torch.Tensor) -> torch.Tensor:
        batch_heads, seq, dim = tensor.shape
        tensor = tensor.reshape(batch_heads // self.heads, self.heads, seq, dim).permute(0, 2, 1, 3)
        return tensor.reshape(batch_heads // self.heads, seq, dim * self.heads)

    def _attention(self, query, key, value, attention_mask=None):
        scores = torch.empty(query.shape[0], query.shape[1], key.shape[1], dtype=query.dtype, device=query.device)
        scores = torch.baddbmm(scores, query, key.transpose(-1, -2), beta=0, alpha=self.scale)
        if attention_mask is not None:
            scores = scores + attention_mask
        if self.upcast_softmax:
            scores = scores.float()
        probs = scores.softmax(dim=-1).to(value.dtype)
        return self.reshape_batch_dim_to_heads(torch.bmm(probs, value))

    def _memory_efficient_attention_xformers(self, query, key, value, attention_mask):
        import xformers.ops  # the CUDA-only path of the original

        out = xformers.ops.memory_efficient_attention(query, key, value, attn_bias=attention_mask)
        return self.reshape_batch_dim_to_heads(out)

    def forward(self, hidden_states, attention_mask=None, video_length: int = 1):
        frames_batch, tokens, channels = hidden_states.shape
        all_frames = hidden_states.reshape(frames_batch // video_length, video_length * tokens, channels)
        query, key, value = (self.reshape_heads_to_batch_dim(p(all_frames)) for p in (self.to_q, self.to_k, self.to_v))
        if self._use_memory_efficient_attention_xformers:
            out = self._memory_efficient_attention_xformers(query, key, value, attention_mask)
        else:
            out = self._attention(query, key, value, attention_mask)
        out = self.to_out[1](self.to_out[0](out))
        return out.reshape(frames_batch, tokens, channels)


class FrameTransformerBlock(nn.Module):
    """Fully-frame self-attention, cross-attention to the text (diffusers ``Attention``), a GEGLU-less feed-forward;
    its xformers setter raises without CUDA, as ControlVideo's does."""

    def __init__(self, dim: int, heads: int, dim_head: int, text_dim: int) -> None:
        super().__init__()
        from ...upstream.diffusers.attention import attention_class

        Attention = attention_class()  # noqa: N806 - diffusers' class, as the adapter finds it in this version

        self.attn1 = FullyFrameAttention(dim, heads, dim_head)
        self.attn2 = Attention(dim, cross_attention_dim=text_dim, heads=heads, dim_head=dim_head)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def set_use_memory_efficient_attention_xformers(self, use_memory_efficient_attention_xformers, attention_op=None):
        if not torch.cuda.is_available():
            raise ValueError(CUDA_REQUIRED)
        self.attn1._use_memory_efficient_attention_xformers = use_memory_efficient_attention_xformers

    def forward(self, hidden_states, encoder_hidden_states, video_length: int):
        hidden_states = self.attn1(self.norm1(hidden_states), video_length=video_length) + hidden_states
        hidden_states = self.attn2(self.norm2(hidden_states), encoder_hidden_states) + hidden_states
        return self.ff(self.norm3(hidden_states)) + hidden_states


class FrameLevel(nn.Module):
    """One UNet level: a residual convolution on each frame, then a transformer block over the frames' tokens."""

    def __init__(self, channels_in: int, channels: int, heads: int, text_dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels, 3, padding=1)
        self.norm = nn.GroupNorm(8, channels)
        self.block = FrameTransformerBlock(channels, heads, channels // heads, text_dim)

    def forward(self, frames, text, video_length: int):
        frames = self.conv(frames)
        batch_frames, channels, height, width = frames.shape
        tokens = self.norm(frames).flatten(2).transpose(1, 2)
        tokens = self.block(tokens, text, video_length)
        return frames + tokens.transpose(1, 2).reshape(batch_frames, channels, height, width)


class TinyControlVideoUNet(nn.Module):
    """``sample`` ``(batch, 4, frames, height, width)`` latents + text ``(batch, tokens, text_dim)`` -> the same
    shape as ``sample``: two levels (the second at half the resolution), each with one fully-frame transformer
    block; ``heads`` heads of ``channels[i] / heads`` per level (SD1.5's 40 and 80 by default)."""

    def __init__(self, channels=(80, 160), heads: int = 2, text_dim: int = 768, latent_channels: int = 4) -> None:
        super().__init__()
        self.latent_channels = latent_channels
        self.down = FrameLevel(latent_channels, channels[0], heads, text_dim)
        self.mid = FrameLevel(channels[0], channels[1], heads, text_dim)
        self.pool = nn.AvgPool2d(2)
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.conv_out = nn.Conv2d(channels[0] + channels[1], latent_channels, 3, padding=1)

    def forward(self, sample: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        batch, channels, frames, height, width = sample.shape
        flat = sample.permute(0, 2, 1, 3, 4).reshape(batch * frames, channels, height, width)
        text = encoder_hidden_states.repeat_interleave(frames, dim=0)  # ControlVideo repeats the text per frame
        first = self.down(flat, text, frames)
        second = self.mid(self.pool(first), text, frames)
        out = self.conv_out(torch.cat([first, self.up(second)], dim=1))
        return out.reshape(batch, frames, channels, height, width).permute(0, 2, 1, 3, 4)
