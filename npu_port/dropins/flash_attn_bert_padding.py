"""npu-port's stand-in for ``flash_attn.bert_padding``: move tokens between a padded ``(batch, seqlen, ...)`` batch and
the packed ``(total, ...)`` form that the varlen functions take.

Follows flash-attn >= 2.6: :func:`unpad_input` takes an optional ``unused_mask`` and returns five items, the last
being the number of used tokens per sequence (flash-attn < 2.6 returned only the first four; code written for it
unpacks ``hidden, indices, cu_seqlens, max_seqlen, *_`` or must be updated). Plain tensor indexing, so autograd works
without flash-attn's custom autograd functions.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def index_first_axis(input: Tensor, indices: Tensor) -> Tensor:
    """``input[indices]`` along the first axis."""
    return input[indices]


def index_put_first_axis(values: Tensor, indices: Tensor, first_axis_dim: int) -> Tensor:
    """A zero tensor with ``first_axis_dim`` rows and ``values`` written at rows ``indices``."""
    output = values.new_zeros((first_axis_dim,) + tuple(values.shape[1:]))
    return output.index_put((indices,), values)


def unpad_input(
    hidden_states: Tensor, attention_mask: Tensor, unused_mask: Optional[Tensor] = None
) -> Tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """``hidden_states`` ``(batch, seqlen, ...)`` and ``attention_mask`` ``(batch, seqlen)`` (1/True = valid token) ->
    ``(hidden (total, ...), indices (total,), cu_seqlens (batch + 1, int32), max_seqlen_in_batch (int),
    used_seqlens_in_batch (batch, int32))``.

    ``unused_mask`` marks tokens that are allocated but unused: they are kept in the packed tensor (and counted in
    ``cu_seqlens``) but not in ``used_seqlens_in_batch``.
    """
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item()) if seqlens_in_batch.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """Inverse of :func:`unpad_input`: ``(total, ...)`` -> ``(batch, seqlen, ...)``, zeros at padding."""
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape((batch, seqlen) + tuple(hidden_states.shape[1:]))
