"""What the two Ascend attention kernels share: device presence, mask polarity, causal masks, limits.

Ascend's attention ops take masks with the opposite polarity to SDPA (True / 1 = masked out) and in a few fixed
shapes, and they *ignore* ``sparse_mode`` / ``next_tockens`` when no mask is passed — so causal attention needs the
compressed 2048 x 2048 upper-triangular mask plus ``sparse_mode=2`` (top-left, SDPA's alignment). Rows whose keys
are all masked are "invalid rows" whose result the docs leave undefined; as for SDPA, they get their keys back
before the op and are zeroed after it, which needs no host synchronisation and no slower ``inner_precise`` mode.
Sources: torch_npu 2.13.0 ``_op_plugin_docs.py`` (extracted in the project's reference notes).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ...device.chips import Chip, current_chip
from ...reasons import Reason
from ..call import AttentionCall
from .base import unmask_empty_rows

PACKAGE = "torch_npu"
#: Side of the compressed causal mask that sparse modes 2, 3 and 4 require.
COMPRESSED_MASK_SIZE = 2048
#: ``sparse_mode`` values used here.
SPARSE_DEFAULT_MASK = 0
SPARSE_LEFT_UP_CAUSAL = 2
#: The ops' "no band limit" value for pre/next tokens.
NO_BAND_LIMIT = 2147483647

_compressed_masks: Dict[torch.device, Tensor] = {}


def compressed_causal_mask(device: torch.device) -> Tensor:
    """The 2048 x 2048 ``triu(k=1)`` bool mask (True = masked) that sparse modes 2-4 take; one per device."""
    mask = _compressed_masks.get(device)
    if mask is None:
        ones = torch.ones(COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE, dtype=torch.bool, device=device)
        mask = _compressed_masks[device] = torch.triu(ones, diagonal=1)
    return mask


def chip_reasons(chip: Optional[Chip], op: str) -> List[Reason]:
    """Why ``op`` (a FlashAttentionScore-family op) does not exist on ``chip`` (910A, 310P); none for an unknown
    chip, which the op itself will judge."""
    if chip is None or chip.fused_attention:
        return []
    return [Reason("chip", f"Ascend {chip.name} has no FlashAttentionScore: {op} is not available ({chip.note})")]


def npu_device_reasons(op: str) -> List[Reason]:
    """Why no NPU can be used although torch_npu imports (driver missing, devices hidden, a chip without the op)."""
    npu = getattr(torch, "npu", None)
    try:
        present = npu is not None and bool(npu.is_available())
    except Exception as exc:  # a half-initialised driver raises here: report it, never crash
        return [Reason("no-device", f"torch.npu.is_available() failed: {type(exc).__name__}: {exc}")]
    if present:
        return chip_reasons(current_chip(), op)
    return [
        Reason(
            "no-device",
            "torch_npu imports but no NPU is visible (torch.npu.is_available() is False); check the driver with "
            "npu-smi info and ASCEND_RT_VISIBLE_DEVICES",
        )
    ]


def ascend_mask(call: AttentionCall, per_head: bool) -> Tuple[Optional[Tensor], Optional[Tensor], int]:
    """``(atten_mask, row_has_key, sparse_mode)`` for an Ascend op, in Ascend polarity (True = masked).

    ``per_head`` says whether the op accepts a ``(B, N, Sq, Skv)`` mask; otherwise the mask is
    ``(B|1, 1, Sq, Skv)`` (callers refuse per-head masks in their reasons).
    """
    if call.mask is None and not call.is_causal:
        return None, None, SPARSE_DEFAULT_MASK
    if call.mask is None and call.q_len > 1:
        return compressed_causal_mask(call.device), None, SPARSE_LEFT_UP_CAUSAL
    keep = call.keep_mask()
    safe_keep, row_has_key = unmask_empty_rows(keep)
    batch = safe_keep.shape[0]
    heads = safe_keep.shape[1]
    if heads != 1 and not per_head:
        raise AssertionError("per-head masks must be refused in reasons() before run()")
    if heads != 1 and batch == 1:
        batch = call.batch  # the ops take BNSS, B1SS, 11SS or SS: a 1NSS mask is expanded over the batch
    masked = ~safe_keep.expand(batch, heads, call.q_len, call.key_len)
    return masked.contiguous(), row_has_key, SPARSE_DEFAULT_MASK


def limit_reasons(
    call: AttentionCall, op: str, *, max_heads: int, max_group: Optional[int], max_batch: int, max_seq: int
) -> List[Reason]:
    """Shape limits from the op docs: heads, GQA ratio, batch, sequence length."""
    found: List[Reason] = []
    if call.heads > max_heads:
        found.append(Reason("heads", f"{call.heads} query heads > {max_heads} ({op} limit)"))
    if max_group is not None and call.group > max_group:
        found.append(Reason("heads", f"query heads / key-value heads = {call.group} > {max_group} ({op} limit)"))
    if call.batch > max_batch:
        found.append(Reason("shape", f"batch {call.batch} > {max_batch} ({op} limit)"))
    longest = max(call.q_len, call.key_len)
    if longest > max_seq:
        found.append(Reason("shape", f"sequence length {longest} > {max_seq} ({op} limit)"))
    return found
