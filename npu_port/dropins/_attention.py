"""What the flash_attn and xformers drop-ins share: their ``(batch, seq, heads, dim)`` layout, and the masks both
packages express with arguments instead of tensors — causal masks aligned top-left or bottom-right, sliding
windows, and packed batches (sequences of different lengths laid end to end, delimited by cumulative offsets).

Everything is computed by :func:`npu_port.attention` (SDPA semantics, the active strategy's kernel); this module only
turns those arguments into its keep-masks. A query row left with no key gives zeros, as in flash-attn.

Packed batches are attended in one call over all tokens with a block-diagonal ``(total_q, total_k)`` bool mask built
with tensor ops (no host sync), as long as that mask has at most :data:`PACKED_MASK_MAX_ELEMENTS` elements. Larger
packed batches are attended one sequence at a time instead — one host sync to read the offsets, then one call per
sequence — so memory grows with ``sum(len_i ** 2)``, not ``total ** 2``.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..attn.api import attention
from ..attn.masks import causal_keep
from ..errors import AttentionInputError

#: Above this many mask elements (``total_q * total_k``) a packed batch is attended sequence by sequence.
PACKED_MASK_MAX_ELEMENTS = 1 << 22

Offsets = Union[Tensor, Sequence[int]]


def attend_bshd(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
) -> Tensor:
    """Attention for ``(B, S, H, D)`` tensors (flash-attn's and xformers' BMHK layout), contiguous output like theirs.

    Key/value heads fewer than query heads are shared across query heads (grouped-query attention).
    """
    out = attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=query.shape[2] != key.shape[2],
    )
    return out.transpose(1, 2).contiguous()


def _band(relative: Tensor, left: int, right: int) -> Tensor:
    """Keep where ``-left <= relative <= right`` (``relative`` = key position - aligned query position; -1 =
    unbounded on that side)."""
    keep = torch.ones_like(relative, dtype=torch.bool)
    if right >= 0:
        keep &= relative <= right
    if left >= 0:
        keep &= relative >= -left
    return keep


def window_bounds(causal: bool, window_size: Sequence[int], key_len: Optional[int] = None) -> Tuple[int, int]:
    """flash-attn's ``(left, right)`` window with ``causal`` folded in (causal = no key to the right).

    With ``key_len``, a side of at least ``key_len`` keys becomes unbounded (-1) first, as flash-attn's ``mha_fwd``
    does (``if (window_size_left >= seqlen_k) window_size_left = -1``, the same for the right; flash-attn-npu copies
    it). That is not in its docstring's formula and changes the result only when there are more queries than keys:
    a row whose aligned position is before the first key then sees every key instead of none.
    """
    left, right = (int(w) for w in window_size)
    if key_len:  # no keys: nothing to see either way
        left = -1 if left >= key_len else left
        right = -1 if right >= key_len else right
    return left, (0 if causal else right)


def band_keep(
    q_len: int, key_len: int, left: int, right: int, *, bottom_right: bool, device: torch.device
) -> Optional[Tensor]:
    """``(q_len, key_len)`` keep-mask: query ``i`` sees keys ``j`` with ``-left <= j - (i + shift) <= right``, where
    ``shift = key_len - q_len`` when aligned bottom-right (flash-attn) and 0 when top-left (SDPA); None = all keys."""
    if left < 0 and right < 0:
        return None
    shift = key_len - q_len if bottom_right else 0
    if left < 0 and right == 0:
        return causal_keep(q_len, key_len, device, q_start=shift)
    relative = torch.arange(key_len, device=device)[None, :] - torch.arange(q_len, device=device)[:, None] - shift
    return _band(relative, left, right)


def attend_dense(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    left: int = -1,
    right: int = -1,
    bottom_right: bool = True,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
) -> Tensor:
    """``(B, S, H, D)`` attention restricted to the band ``left``/``right`` (see :func:`band_keep`).

    Plain causal with equal lengths (where both alignments agree) goes through ``is_causal`` so kernels can use
    their fast causal path; everything else gets an explicit mask.
    """
    q_len, key_len = query.shape[1], key.shape[1]
    if left < 0 and right == 0 and (q_len == key_len or not bottom_right):
        return attend_bshd(query, key, value, is_causal=True, dropout_p=dropout_p, scale=scale)
    keep = band_keep(q_len, key_len, left, right, bottom_right=bottom_right, device=query.device)
    return attend_bshd(query, key, value, keep, dropout_p=dropout_p, scale=scale)


def key_length_keep(q_len: int, key_lengths: Tensor, key_len: int, left: int, right: int) -> Tensor:
    """``(B, 1, q_len, key_len)`` keep-mask for a batch whose item ``b`` has only its first ``key_lengths[b]`` keys
    (a KV cache filled to different lengths), with the band aligned bottom-right to each item's own length."""
    device = key_lengths.device
    lengths = key_lengths.to(torch.long)[:, None, None, None]
    cols = torch.arange(key_len, device=device)[None, None, None, :]
    keep = cols < lengths
    if left >= 0 or right >= 0:
        rows = torch.arange(q_len, device=device)[None, None, :, None]
        keep = keep & _band(cols - rows - (lengths - q_len), left, right)
    return keep


def _as_offsets(offsets: Offsets, device: torch.device) -> Tensor:
    if isinstance(offsets, Tensor):
        return offsets.to(device=device, dtype=torch.long)
    return torch.tensor(list(offsets), dtype=torch.long, device=device)


def _segments(offsets: Tensor, total: int) -> Tuple[Tensor, Tensor]:
    """Per token: its sequence's index (-1 past the last offset) and its position in that sequence. Tensor ops
    only: no host sync."""
    sequences = offsets.numel() - 1
    tokens = torch.arange(total, device=offsets.device)
    index = torch.searchsorted(offsets[1:].contiguous(), tokens, right=True)  # sequences that end at or before
    position = tokens - offsets[index.clamp(max=max(sequences - 1, 0))]
    return torch.where(index < sequences, index, -1), position


def packed_keep(
    q_offsets: Offsets,
    k_offsets: Offsets,
    total_q: int,
    total_k: int,
    left: int,
    right: int,
    *,
    bottom_right: bool,
    device: torch.device,
) -> Tensor:
    """``(total_q, total_k)`` block-diagonal keep-mask for packed sequences (``offsets``: cumulative lengths, B+1),
    with the band of :func:`band_keep` applied inside each block. Tokens past the last offset see nothing."""
    q_offsets, k_offsets = _as_offsets(q_offsets, device), _as_offsets(k_offsets, device)
    q_seq, q_pos = _segments(q_offsets, total_q)
    k_seq, k_pos = _segments(k_offsets, total_k)
    keep = (q_seq[:, None] == k_seq[None, :]) & (q_seq >= 0)[:, None]
    if (left >= 0 or right >= 0) and q_offsets.numel() > 1:
        shift = 0
        if bottom_right:  # per query token: its sequence's key length - query length
            surplus = (k_offsets[1:] - k_offsets[:-1]) - (q_offsets[1:] - q_offsets[:-1])
            shift = surplus[q_seq.clamp(min=0)][:, None]
        keep &= _band(k_pos[None, :] - q_pos[:, None] - shift, left, right)
    return keep


def attend_packed(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    q_offsets: Offsets,
    k_offsets: Offsets,
    *,
    left: int = -1,
    right: int = -1,
    bottom_right: bool = True,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
) -> Tensor:
    """Attention over packed sequences: ``query`` ``(total_q, H, D)``, ``key``/``value`` ``(total_k, H_kv, D)``;
    sequence ``b`` is ``query[q_offsets[b]:q_offsets[b + 1]]`` and sees only its own keys. Returns
    ``(total_q, H, Dv)`` (rows past the last offset are zeros)."""
    if len(q_offsets) != len(k_offsets):
        raise AttentionInputError(
            f"query and key offsets must describe the same number of sequences; got {len(q_offsets) - 1} and "
            f"{len(k_offsets) - 1}"
        )
    total_q, total_k = query.shape[0], key.shape[0]
    if total_q * total_k <= PACKED_MASK_MAX_ELEMENTS:
        keep = packed_keep(
            q_offsets, k_offsets, total_q, total_k, left, right, bottom_right=bottom_right, device=query.device
        )
        out = attend_bshd(query[None], key[None], value[None], keep, dropout_p=dropout_p, scale=scale)
        return out[0]
    return _attend_each(query, key, value, q_offsets, k_offsets, left, right, bottom_right, dropout_p, scale)


def _attend_each(query, key, value, q_offsets, k_offsets, left, right, bottom_right, dropout_p, scale) -> Tensor:
    """The large-batch path of :func:`attend_packed`: one call per sequence (one host sync for the offsets)."""
    q_starts = _as_list(q_offsets)
    k_starts = _as_list(k_offsets)
    pieces: List[Tensor] = []
    for q_start, q_end, k_start, k_end in zip(q_starts, q_starts[1:], k_starts, k_starts[1:]):
        pieces.append(
            attend_dense(
                query[None, q_start:q_end],
                key[None, k_start:k_end],
                value[None, k_start:k_end],
                left=left,
                right=right,
                bottom_right=bottom_right,
                dropout_p=dropout_p,
                scale=scale,
            )[0]
        )
    past_end = query.shape[0] - q_starts[-1]
    if past_end > 0 or not pieces:
        pieces.append(query.new_zeros((past_end,) + tuple(query.shape[1:-1]) + (value.shape[-1],)))
    return torch.cat(pieces, dim=0)


def _as_list(offsets: Offsets) -> List[int]:
    return [int(x) for x in (offsets.tolist() if isinstance(offsets, Tensor) else offsets)]
