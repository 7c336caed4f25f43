"""Sequence-parallel attention over torch.distributed: Ulysses (heads exchanged for sequence), ring (every rank's
keys visited, partial results merged with their log-sum-exp), and both at once.

Why our own and not diffusers' templated ring: diffusers 0.42's ring hands the *same* local mask to every ring step
while the keys rotate, so a text mask is applied to the wrong keys on every rank but one; its unified Ulysses x ring
path does not exchange the mask at all; and its ring merge needs a backend that returns the log-sum-exp, which the
NPU backend refuses. Here a key mask is gathered once, in the order the keys are, and sliced per step; every partial
result comes from an npu-port kernel with ``return_lse=True``. The communication is torch.distributed's
(``all_to_all_single``, ``all_gather_into_tensor``) on the process groups of diffusers' device mesh: no layer of our
own.

Layout: ``(batch, seq, heads, head_dim)`` in and out, as diffusers' dispatcher gives it. The sequence is split over
the flattened ("ring", "ulysses") mesh as diffusers' ``_cp_plan`` hooks split it: rank ``r * U + u`` holds chunk
``r * U + u``. After the Ulysses exchange, ring rank ``r`` holds the contiguous block ``r`` of ``U`` chunks with
``heads / U`` heads; ring step ``j`` attends to block ``j``'s keys. Inference only (no backward): a call that needs
gradients is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import ParallelError
from .traffic import TRAFFIC

#: ``attend(query, key, value, mask) -> (out, lse)`` in ``(B, S, H, D)`` / ``(B, S, H)`` float32 lse.
AttendLse = Callable[[Tensor, Tensor, Tensor, Optional[Tensor]], Tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class SequenceGroups:
    """The process groups and degrees of one context-parallel layout (read from diffusers' config)."""

    ulysses: int
    ring: int
    ulysses_group: Any
    ring_group: Any
    all_group: Any  # every rank of the sequence split (the flattened mesh)
    ulysses_rank: int
    ring_rank: int
    ulysses_anything: bool = False

    @property
    def size(self) -> int:
        return self.ulysses * self.ring

    @classmethod
    def from_config(cls, cp: Any) -> "SequenceGroups":
        """From a diffusers ``ContextParallelConfig`` after ``setup`` (its meshes and local ranks, read through
        :func:`npu_port.upstream.diffusers.parallel.config_meshes`)."""
        from ..upstream.diffusers.parallel import config_meshes

        meshes = config_meshes(cp)
        return cls(
            ulysses=int(cp.ulysses_degree),
            ring=int(cp.ring_degree),
            ulysses_group=meshes["ulysses_mesh"].get_group(),
            ring_group=meshes["ring_mesh"].get_group(),
            all_group=meshes["flattened_mesh"].get_group(),
            ulysses_rank=int(meshes["ulysses_rank"]),
            ring_rank=int(meshes["ring_rank"]),
            ulysses_anything=bool(getattr(cp, "ulysses_anything", False)),
        )


# ---- collectives (counted) ------------------------------------------------------------------------------------

#: torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single`` (the old name warns); older ones have only it.
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_to_all(chunks: Tensor, group: Any, ranks: int) -> Tensor:
    """``chunks[i]`` goes to rank ``i``; returns what each rank sent here, stacked in rank order."""
    chunks = chunks.contiguous()
    received = torch.empty_like(chunks)
    dist.all_to_all_single(received, chunks, group=group)
    TRAFFIC.add("all_to_all", chunks.numel() * chunks.element_size() * (ranks - 1) / ranks)
    return received


def all_gather_stacked(tensor: Tensor, group: Any, ranks: int) -> Tensor:
    """Every rank's ``tensor`` stacked on a new leading dimension, in rank order (bool is sent as uint8: not every
    backend carries bool)."""
    send = tensor.contiguous()
    as_bytes = send.dtype == torch.bool
    if as_bytes:
        send = send.to(torch.uint8)
    gathered = torch.empty(ranks * send.numel(), dtype=send.dtype, device=send.device)  # flat: what every backend takes
    _gather_into(gathered, send.reshape(-1), group=group)
    TRAFFIC.add("all_gather", send.numel() * send.element_size() * (ranks - 1))
    gathered = gathered.view((ranks,) + tuple(send.shape))
    return gathered.bool() if as_bytes else gathered


# ---- Ulysses ----------------------------------------------------------------------------------------------------


def heads_for_sequence(x: Tensor, groups: SequenceGroups) -> Tensor:
    """``(B, S, H, D)`` with this rank's sequence chunk and all heads -> ``(B, U*S, H/U, D)``: the ulysses group's
    whole sequence (its chunks in rank order) for this rank's share of the heads."""
    u = groups.ulysses
    batch, seq, heads, dim = x.shape
    chunks = x.reshape(batch, seq, u, heads // u, dim).permute(2, 0, 1, 3, 4)  # (U, B, S, H/U, D)
    received = _all_to_all(chunks, groups.ulysses_group, u)  # [i]: rank i's chunk of my heads
    return received.permute(1, 0, 2, 3, 4).reshape(batch, u * seq, heads // u, dim)


def sequence_for_heads(x: Tensor, groups: SequenceGroups) -> Tensor:
    """The inverse of :func:`heads_for_sequence`: ``(B, U*S, H/U, D)`` -> ``(B, S, H, D)``."""
    u = groups.ulysses
    batch, full, heads, dim = x.shape
    seq = full // u
    chunks = x.reshape(batch, u, seq, heads, dim).permute(1, 0, 2, 3, 4)  # (U, B, S, H/U, D): [i] is rank i's part
    received = _all_to_all(chunks, groups.ulysses_group, u)  # [i]: my sequence part of rank i's heads
    return received.permute(1, 2, 0, 3, 4).reshape(batch, seq, u * heads, dim)


# ---- ring -------------------------------------------------------------------------------------------------------


def merge_partials(out: Tensor, lse: Tensor, part_out: Tensor, part_lse: Tensor) -> Tuple[Tensor, Tensor]:
    """Two softmax-normalised partial results over disjoint key sets, merged exactly (float32):
    ``lse = log(e^a + e^b)``, ``out = e^(a - lse) out_a + e^(b - lse) out_b``. A row with no key in either part
    (both ``-inf``) stays ``-inf`` with zeros; NaN stays NaN."""
    merged = torch.logaddexp(lse, part_lse)
    empty = merged == float("-inf")
    weight = torch.where(empty, 0.0, torch.exp(lse - merged)).unsqueeze(-1)
    part_weight = torch.where(empty, 0.0, torch.exp(part_lse - merged)).unsqueeze(-1)
    return out * weight + part_out * part_weight, merged


def ring_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor], groups: SequenceGroups, attend: AttendLse
) -> Tuple[Tensor, Tensor]:
    """Attention of this rank's queries over every ring rank's keys: the key/value blocks are gathered once, each
    block's partial result comes with its log-sum-exp and they are merged. ``mask``: over the whole gathered key
    sequence (its last dimension ``ring * S_kv``), sliced per block."""
    ring = groups.ring
    key_len = key.shape[1]
    packed = torch.cat([key.reshape(-1), value.reshape(-1)])
    blocks = all_gather_stacked(packed, groups.ring_group, ring)
    out = lse = None
    for block in range(ring):
        if block == groups.ring_rank:
            block_key, block_value = key, value
        else:
            block_key = blocks[block, : key.numel()].view_as(key)
            block_value = blocks[block, key.numel() :].view_as(value)
        block_mask = None if mask is None else mask[..., block * key_len : (block + 1) * key_len]
        part_out, part_lse = attend(query, block_key, block_value, block_mask)
        part_out = part_out.float()
        if out is None:
            out, lse = part_out, part_lse
        else:
            out, lse = merge_partials(out, lse, part_out, part_lse)
    return out, lse


# ---- the whole call ---------------------------------------------------------------------------------------------


def context_parallel_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor],
    groups: SequenceGroups,
    attend: AttendLse,
    return_lse: bool = False,
    attend_plain: Optional[Callable[[Tensor, Tensor, Tensor, Optional[Tensor]], Tensor]] = None,
):
    """Attention over the whole split sequence, from this rank's chunk: Ulysses, then ring, then Ulysses back.

    ``attend_plain`` (same arguments, the output alone): used when nothing needs the log-sum-exp — Ulysses alone
    and no ``return_lse`` — so that kernels that cannot return it (SDPA's flash / efficient backends on CUDA,
    xformers) still run.

    ``mask``: None, or a key mask over the *whole* key sequence in rank order (``(B, 1 or H, 1, U*R*S_kv)``; see
    :func:`gather_key_mask`). Returns ``out`` in ``query``'s dtype, and ``lse`` ``(B, S, H)`` float32 when asked."""
    heads = query.shape[2]
    u = groups.ulysses
    padded = -heads % u  # ulysses_anything: zero heads up to a multiple of U (their output is dropped)
    if padded:
        query, key, value = (torch.nn.functional.pad(t, (0, 0, 0, padded)) for t in (query, key, value))
        if mask is not None and mask.shape[1] == heads:
            mask = torch.cat([mask, mask[:, :1].expand(-1, padded, -1, -1)], dim=1)
        heads += padded
    if u > 1:
        query, key, value = (heads_for_sequence(t, groups) for t in (query, key, value))
        if mask is not None and mask.shape[1] == heads:
            share = heads // u
            mask = mask[:, groups.ulysses_rank * share : (groups.ulysses_rank + 1) * share]
    if groups.ring > 1:
        out, lse = ring_attention(query, key, value, mask, groups, attend)
    elif attend_plain is not None and not return_lse:
        out, lse = attend_plain(query, key, value, mask), None
    else:
        out, lse = attend(query, key, value, mask)
    out = out.to(query.dtype)
    if u > 1:
        out = sequence_for_heads(out, groups)
        if return_lse:
            lse = sequence_for_heads(lse.unsqueeze(-1), groups).squeeze(-1)
    if padded:
        out = out[:, :, : heads - padded]
        lse = lse[:, :, : heads - padded] if return_lse else lse
    return (out, lse) if return_lse else out


def key_mask(mask: Optional[Tensor], batch: int, heads: int, local_keys: int) -> Optional[Tensor]:
    """A mask given to a context-parallel call as ``(B, 1 or H, 1, S_kv_local)`` (2-D ``(B, S_kv)`` and 3-D
    ``(B, 1, S_kv)`` forms are widened) — or one clear error: under context parallelism a mask can only cover this
    rank's keys, split with the sequence by the model's ``_cp_plan``, and cannot vary per query."""
    if mask is None:
        return None
    given = tuple(mask.shape)  # named in the error as the caller passed it, not as widened here
    if mask.ndim == 2 and mask.shape[0] in (1, batch):
        mask = mask[:, None, None, :]
    elif mask.ndim == 3:
        mask = mask[:, None]
    if mask.ndim == 4 and mask.shape[2] == 1 and mask.shape[1] in (1, heads) and mask.shape[0] not in (1, batch):
        raise ParallelError(
            f"attention mask of shape {given} is for a batch of {mask.shape[0]}, but the call's batch is {batch}"
        )
    if mask.ndim != 4 or mask.shape[2] != 1 or mask.shape[1] not in (1, heads):
        raise ParallelError(
            f"attention mask of shape {given} under context parallelism: only key masks can be split with "
            f"the sequence — (batch, keys), (batch, 1, keys) or (batch, 1 or heads, 1, keys); a mask that varies per "
            "query needs the whole sequence on one device"
        )
    if mask.shape[-1] != local_keys:
        raise ParallelError(
            f"attention mask covers {mask.shape[-1]} keys but this rank holds {local_keys}: under context parallelism "
            "the mask must be split with the sequence (list it in the model's _cp_plan, as diffusers' QwenImage does "
            "with encoder_hidden_states_mask)"
        )
    return mask


def gather_key_mask(mask: Tensor, groups: SequenceGroups) -> Tensor:
    """Every rank's key mask joined along the keys, in rank order: the mask of the whole gathered key sequence."""
    stacked = all_gather_stacked(mask, groups.all_group, groups.size)  # (N, B, h, 1, S)
    return torch.cat(stacked.unbind(0), dim=-1)


def check_call(
    query: Tensor, key: Tensor, value: Tensor, dropout_p: float, is_causal: bool, enable_gqa: bool, groups: Any
) -> None:
    """Refuse, with one line each, what the sequence-parallel path cannot compute faithfully."""
    if is_causal:
        raise ParallelError(
            "is_causal=True under context parallelism is not supported: each rank holds a slice of the sequence; "
            "run causal attention without enable_parallelism, or pass an explicit key mask"
        )
    if dropout_p:
        raise ParallelError(f"attention dropout ({dropout_p}) under context parallelism is not supported (inference)")
    if enable_gqa or key.shape[2] != query.shape[2]:
        raise ParallelError(
            f"grouped-query attention ({query.shape[2]} query heads, {key.shape[2]} key heads) under context "
            "parallelism is not supported; repeat the key/value heads first"
        )
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        raise ParallelError(
            "context-parallel attention through npu-port is inference-only (no backward); run under torch.no_grad()"
        )
    if query.shape[2] % groups.ulysses and not groups.ulysses_anything:
        valid = [d for d in range(1, query.shape[2] + 1) if query.shape[2] % d == 0]
        raise ParallelError(
            f"{query.shape[2]} attention heads cannot be split over ulysses degree {groups.ulysses}: valid ulysses "
            f"degrees for this model: {', '.join(map(str, valid))} (or ulysses_anything=True)"
        )
