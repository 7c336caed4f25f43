"""diffusers' ``AttentionBlock`` (0.11–0.16): the inline attention of the VAE and of some UNet blocks, routed.

Before diffusers 0.17 the VAE's mid-block attention (and ``AttnDownBlock2D`` / ``AttnUpBlock2D`` and friends) is
``diffusers.models.attention.AttentionBlock``, which has no ``_attention`` method and no processor: its ``forward``
computes the attention inline — ``baddbmm`` scores scaled by ``1/sqrt(channels/num_heads)``, a softmax in float32,
a ``bmm`` — or, behind its ``_use_memory_efficient_attention_xformers`` flag, calls ``xformers.ops`` (which fails
without CUDA). The only way to route it is to replace ``forward`` with one that does exactly the same steps around
the attention core and hands the core to the attention function that
:func:`~npu_port.integrations.legacy_scope.attention_for` gives: a target's strategy while a targeted module runs,
else ``npu_port.attention`` (the process-wide strategy) for a class routed process-wide, else none — the original
``forward`` runs.

The routed ``forward`` ignores the xformers flag (routed attention is what the flag asks for, on any device) and
computes the core in float32 or wider, as the original's softmax does; its result is returned in the projections'
dtype, as the original returns it. :mod:`npu_port.integrations.legacy_attention` installs it on the class (shared,
counted and undone like the legacy routes); only classes whose ``forward`` is diffusers' own are routed — a
subclass that overrides ``forward`` computes something we have not read.

Nothing here imports diffusers: ``AttentionBlock`` is asked of the diffusers adapter only once diffusers was imported
(no instance can exist otherwise), and newer diffusers simply have none.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ..upstream.diffusers import attention as upstream
from .legacy_scope import attention_for

NAME = "AttentionBlock"


def attention_block_class() -> Optional[type]:
    """diffusers' ``AttentionBlock`` when diffusers is imported and has one (up to 0.16), else None."""
    return upstream.attention_block_class()


def _original(fn: Any) -> Any:
    return getattr(fn, "__npu_port_original__", fn)


def is_attention_block_class(cls: Any) -> bool:
    """True for diffusers' ``AttentionBlock`` and subclasses that keep its ``forward`` (the one we route)."""
    base = attention_block_class()
    if base is None or not isinstance(cls, type) or not issubclass(cls, base):
        return False
    own = _original(vars(base).get("forward"))
    if getattr(own, "__module__", None) != base.__module__ or getattr(own, "__qualname__", None) != f"{NAME}.forward":
        return False  # someone else's forward on the class itself: not the computation we reproduce
    return _original(inspect.getattr_static(cls, "forward")) is own


def routed_forward(original: Callable[..., Tensor], owner: type) -> Callable[..., Tensor]:
    """``AttentionBlock.forward(self, hidden_states)`` with the attention core routed (``owner``: the class it is
    installed on)."""

    def forward(self, hidden_states):
        attention = attention_for(owner)
        if attention is None or not isinstance(hidden_states, Tensor) or hidden_states.dim() != 4:
            return original(self, hidden_states)  # not routed here; or the original's own error for non-(B, C, H, W)
        residual = hidden_states
        batch, channel, height, width = hidden_states.shape

        hidden_states = self.group_norm(hidden_states)
        hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)

        query_proj = self.query(hidden_states)
        key_proj = self.key(hidden_states)
        value_proj = self.value(hidden_states)

        heads = self.num_heads
        scale = 1 / math.sqrt(self.channels / heads)
        dtype = torch.promote_types(query_proj.dtype, torch.float32)  # the original's softmax is float32
        q, k, v = (
            t.to(dtype).reshape(batch, height * width, heads, t.shape[-1] // heads).transpose(1, 2)
            for t in (query_proj, key_proj, value_proj)
        )
        hidden_states = attention(q, k, v, scale=scale)  # (batch, heads, seq, head_dim)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch, height * width, channel).to(query_proj.dtype)

        hidden_states = self.proj_attn(hidden_states)
        hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channel, height, width)
        return (hidden_states + residual) / self.rescale_output_factor

    forward.__name__ = forward.__qualname__ = "forward"
    forward.__doc__ = "npu-port: AttentionBlock.forward with the attention core routed by npu-port."
    forward.__npu_port_original__ = original  # type: ignore[attr-defined]
    return forward
