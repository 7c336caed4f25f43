"""The steps of diffusers 0.12–0.14's standard processors, with the attention core handed to a route.

diffusers 0.12–0.14 keep their processors in ``diffusers.models.cross_attention``: ``CrossAttnProcessor`` (``baddbmm``
scores through ``attn.get_attention_scores``), ``AttnProcessor2_0`` (0.13 onwards; SDPA) and
``XFormersCrossAttnProcessor`` (``xformers.ops.memory_efficient_attention``). Around the core they do the same
thing, in this order — and less than the later ``Attention`` processors do: no spatial norm, no group norm, no 4-D
inputs, no residual or rescale, no q/k norms. So :class:`~.processor.RoutedAttnProcessor` runs these steps on a
0.12–0.14 ``CrossAttention`` instead of its own (it finds out which from :func:`.classes.load`).

The mask is the legacy additive one, ``(batch*heads, 1|q_len, key_len)`` from ``attn.prepare_attention_mask``,
unfolded to ``(batch, heads, 1|q_len, key_len)`` as ``AttnProcessor2_0`` does. ``attn.scale`` is passed on (it is
``dim_head**-0.5``, what ``AttnProcessor2_0`` uses implicitly). The core runs in the projections' dtype, as
``AttnProcessor2_0`` — what 0.13 and 0.14 install by default on torch 2 — runs it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import torch

from .routing import Route


@functools.lru_cache(maxsize=None)
def _mask_takes_batch_size(cls: type) -> bool:
    """0.13 onwards: ``prepare_attention_mask(mask, target_length, batch_size=None)``; 0.12 has no batch size."""
    return "batch_size" in inspect.signature(cls.prepare_attention_mask).parameters


def cross_attention_call(
    route: Route,
    stands_in_for: type,
    attn: Any,
    hidden_states: torch.Tensor,
    encoder_hidden_states: Optional[torch.Tensor] = None,
    attention_mask: Optional[torch.Tensor] = None,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """One call of a 0.12–0.14 standard processor (see the module docstring), the core through ``route``."""
    if args or kwargs:  # the processors this stands in for take no other argument (cross_attention_kwargs fail)
        extra = repr(next(iter(kwargs))) if kwargs else f"{len(args)} more positional"
        raise TypeError(f"{stands_in_for.__name__}.__call__() got an unexpected argument: {extra}")

    batch_size, sequence_length, _ = hidden_states.shape
    if attention_mask is not None:
        if _mask_takes_batch_size(type(attn)):
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        else:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

    query = attn.to_q(hidden_states)
    if encoder_hidden_states is None:
        encoder_hidden_states = hidden_states
    elif getattr(attn, "cross_attention_norm", False):  # 0.13 onwards
        encoder_hidden_states = attn.norm_cross(encoder_hidden_states)
    key = attn.to_k(encoder_hidden_states)
    value = attn.to_v(encoder_hidden_states)

    head_dim = key.shape[-1] // attn.heads
    query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)

    hidden_states = route.attend("processor", query, key, value, attention_mask, scale=attn.scale)

    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
    hidden_states = hidden_states.to(query.dtype)
    hidden_states = attn.to_out[0](hidden_states)
    return attn.to_out[1](hidden_states)
