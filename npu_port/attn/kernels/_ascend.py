"""What the two Ascend attention kernels share: device presence, mask polarity and forms, causal masks, limits.

Ascend's attention ops take masks with the opposite polarity to SDPA (True / 1 = masked out) and in a few fixed
shapes, and they *ignore* ``sparse_mode`` / ``next_tockens`` when no mask is passed — so causal attention needs the
compressed 2048 x 2048 upper-triangular mask plus ``sparse_mode=2`` (top-left, SDPA's alignment). Rows whose keys
are all masked are "invalid rows" whose result the docs leave undefined; as for SDPA, they get their keys back
before the op and are zeroed after it, which needs no slower ``inner_precise`` mode.

The ops take bool masks only. A float mask that is a pure mask (0 and masked values) becomes the bool mask, exactly;
a key-padding mask (kept keys a prefix of each batch item) becomes ``actual_seq_lengths_kv`` on the inference op, so
no ``(Sq, Skv)`` mask is built at all; a real bias is refused with the reason (the ops' ``pse`` inputs are not
pinned down by their docs). Purity and lengths are read once per mask tensor, and each converted form is built once
per mask tensor and call signature (:func:`npu_port.attn.masks.memoized`).
Sources: torch_npu 2.13.0 ``_op_plugin_docs.py`` (extracted in the project's reference notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ...device.chips import Chip, current_chip
from ...errors import KernelRuntimeError
from ...reasons import Reason
from ...settings import check_masked_value
from ..call import AttentionCall
from ..masks import causal_keep, describe_masked, float_mask_facts, key_padding_lengths, mask_keep, memoized
from ..target import Target
from .base import FromStrategy, Kernel, Option, unmask_empty_rows

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


#: How a call's mask reaches an Ascend op (:func:`mask_form`).
NO_MASK = "none"  # no mask at all
CAUSAL = "causal"  # the shared compressed mask with sparse_mode=2
LENGTHS = "lengths"  # actual_seq_lengths_kv, no mask (npu_fused_infer_attention_score only)
LENGTHS_CAUSAL = "lengths+causal"  # both
FULL = "full"  # a (B|1, N|1, Sq, Skv) bool mask


@dataclass(frozen=True)
class AscendMask:
    """What an Ascend op gets for a call's mask: ``atten_mask`` (True = masked) and ``sparse_mode``, or the key
    lengths (``actual_seq_lengths_kv``); and ``row_has_key``, the rows to zero afterwards (None: every row has a
    key). Rows with no key are given their keys back for the op (an all-masked row is the ops' undefined "invalid
    row"), as a length of Skv in the compact form."""

    form: str
    atten_mask: Optional[Tensor]
    row_has_key: Optional[Tensor]
    sparse_mode: int
    kv_lengths: Optional[Tuple[int, ...]] = None


def mask_form(call: AttentionCall, masked_value: Optional[float], lengths: bool) -> str:
    """Which form ``call``'s mask takes (no tensor is built; a key-padding mask's lengths are read once per mask
    tensor). ``lengths``: whether the op takes ``actual_seq_lengths_kv`` in this layout (the inference op with BNSD;
    npu_fusion_attention takes lengths only in its TND varlen layout, which needs the tokens repacked, so it always
    gets the full mask)."""
    if call.mask is None:
        if not call.is_causal:
            return NO_MASK
        return CAUSAL if call.q_len > 1 else FULL  # with one query the ops ignore sparse_mode
    if lengths and not (call.is_causal and call.q_len == 1) and _pure(call, masked_value):
        if key_padding_lengths(call.mask, masked_value) is not None:
            return LENGTHS_CAUSAL if call.is_causal else LENGTHS
    return FULL


def _pure(call: AttentionCall, masked_value: Optional[float]) -> bool:
    facts = float_mask_facts(call.mask, masked_value)
    return facts is None or facts.pure


def ascend_mask(
    call: AttentionCall, per_head: bool, masked_value: Optional[float] = None, lengths: bool = False
) -> AscendMask:
    """The op's mask for ``call`` in Ascend polarity (True = masked): none, the compressed causal mask, the key
    lengths, or the full mask — converted once per mask tensor and call signature (:func:`memoized`), so the layers
    of a model that share one mask share one conversion.

    ``per_head`` says whether the op accepts a ``(B, N, Sq, Skv)`` mask; otherwise the mask is
    ``(B|1, 1, Sq, Skv)`` (callers refuse per-head masks in their reasons).
    """
    if call.mask is not None and not _pure(call, masked_value):
        raise KernelRuntimeError(
            f"the Ascend kernels take pure float masks only; reasons() refuses this call ({call.describe()})"
        )
    form = mask_form(call, masked_value, lengths)
    if form == NO_MASK:
        return AscendMask(form, None, None, SPARSE_DEFAULT_MASK)
    if form == CAUSAL:
        return AscendMask(form, compressed_causal_mask(call.device), None, SPARSE_LEFT_UP_CAUSAL)
    if form in (LENGTHS, LENGTHS_CAUSAL):
        return _lengths_mask(call, form, masked_value)
    if call.mask is None:  # a single causal query: it sees key 0 only
        return AscendMask(form, *_full_mask(call, masked_value, per_head), SPARSE_DEFAULT_MASK)
    signature = ("ascend-full", masked_value, per_head, call.is_causal, call.batch, call.q_len, call.key_len)
    masked, row_has_key = memoized(call.mask, signature, lambda: _full_mask(call, masked_value, per_head))
    return AscendMask(form, masked, row_has_key, SPARSE_DEFAULT_MASK)


def _lengths_mask(call: AttentionCall, form: str, masked_value: Optional[float]) -> AscendMask:
    found = key_padding_lengths(call.mask, masked_value)
    passed = tuple(length if length else call.key_len for length in found)  # an empty item gets its keys back
    row_has_key = None
    if not all(found):
        row_has_key = memoized(
            call.mask,
            ("ascend-rows", masked_value, found),
            lambda: torch.tensor([bool(n) for n in found], device=call.device).reshape(-1, 1, 1, 1),
        )
    if form == LENGTHS_CAUSAL:
        return AscendMask(form, compressed_causal_mask(call.device), row_has_key, SPARSE_LEFT_UP_CAUSAL, passed)
    return AscendMask(form, None, row_has_key, SPARSE_DEFAULT_MASK, passed)


def _full_mask(call: AttentionCall, masked_value: Optional[float], per_head: bool) -> Tuple[Tensor, Tensor]:
    keep = causal_keep(call.q_len, call.key_len, call.device)[None, None] if call.mask is None else None
    if keep is None:
        keep = mask_keep(call.mask, masked_value)
        if call.is_causal:
            keep = keep & causal_keep(call.q_len, call.key_len, call.device)[None, None]
    safe_keep, row_has_key = unmask_empty_rows(keep)
    batch, heads = _full_shape(safe_keep.shape, call)
    if heads != 1 and not per_head:
        raise AssertionError("per-head masks must be refused in reasons() before run()")
    return (~safe_keep.expand(batch, heads, call.q_len, call.key_len)).contiguous(), row_has_key


def _full_shape(shape: Tuple[int, ...], call: AttentionCall) -> Tuple[int, int]:
    """Batch and heads of the full mask: the ops take BNSS, B1SS, 11SS or SS, so a 1NSS mask is expanded over the
    batch."""
    batch, heads = shape[0], shape[1]
    return (call.batch if heads != 1 and batch == 1 else batch), heads


def mask_bytes(call: AttentionCall, masked_value: Optional[float], lengths: bool) -> int:
    """Device bytes of the mask built for ``call`` (one bool byte per entry): 0 when the op gets no mask, the key
    lengths or the compressed causal mask (one 2048 x 2048 mask per device, 4 MiB, shared by every call)."""
    if mask_form(call, masked_value, lengths) != FULL:
        return 0
    batch, heads = (1, 1) if call.mask is None else _full_shape(tuple(call.mask.shape), call)
    return batch * heads * call.q_len * call.key_len


def float_mask_reasons(
    call: AttentionCall, kernel: str, masked_value: Optional[float], pse_note: str, grad: bool
) -> List[Reason]:
    """Why an Ascend kernel cannot take ``call``'s float mask: it is a bias (the ops' bias inputs are not used:
    ``pse_note`` says why), or, for the training op (``grad``), it requires a gradient that a bool mask cannot
    carry. A pure mask is converted, so it is no reason."""
    facts = float_mask_facts(call.mask, masked_value)
    shape = tuple(call.mask.shape)
    if not facts.pure:
        declare = (
            " (declare your masks' masking value, e.g. diffusers' -10000, with the masked_value option)"
            if masked_value is None
            else ""
        )
        return [
            Reason(
                "mask",
                f"float mask {shape} is a bias, not a pure mask: it holds {facts.example:g}, and a pure mask holds "
                f"only 0 (kept) and masked values ({describe_masked(masked_value)}); {pse_note}; pass a bool "
                f"keep-mask or a pure mask{declare}, or run the call on the sdpa or chunked "
                "kernel, which add a bias as it is",
            )
        ]
    if grad and call.needs_grad and call.mask.bias.requires_grad:
        return [
            Reason(
                "mask",
                f"float mask {shape} requires grad: as {kernel}'s bool mask it would get no gradient; use a kernel "
                "that adds it to the scores (sdpa, chunked, math)",
            )
        ]
    return []


#: Why the ops' bias inputs are not used (the ``pse_note`` of :func:`float_mask_reasons`).
FUSION_PSE_NOTE = (
    "npu_fusion_attention's pse input could carry a bias, but its docs scale it two ways and no test of theirs pins "
    "one: the formula softmax(scale * (pse + q k^T)), the example softmax(scale * q k^T + pse)"
)
FIA_PSE_NOTE = (
    "npu_fused_infer_attention_score's pse_shift input could carry a bias, but its documented formula "
    "softmax(scale * q k^T + atten_mask) has no pse, so how it is scaled is not documented"
)


def no_key_lse(lse: Tensor, row_has_key: Optional[Tensor]) -> Tensor:
    """The ``(B, N, Sq)`` log-sum-exp with -inf in rows that have no key (the op saw their keys given back)."""
    return lse if row_has_key is None else lse.masked_fill(~row_has_key[..., 0], float("-inf"))


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


class AscendKernel(Kernel):
    """What the two Ascend kernels share: the package, the device and chip checks, and everything about masks (the
    ``masked_value`` option, which float masks they take, the form each mask reaches the op in, its bytes). A
    subclass names its ``op``, says whether that op takes per-head masks and key lengths, and why its bias input
    is not used (``pse_note``)."""

    package = PACKAGE
    supports_float_mask = False  # a bias: no; a pure float mask is converted (float_mask_reasons)
    OPTIONS = {
        "masked_value": Option(
            None,
            check_masked_value,
            "an additive mask value that counts as masked, exactly (e.g. diffusers' -10000.0): float masks holding "
            "only 0 and masked values become the op's bool mask",
        )
    }
    STRATEGY_OPTIONS = {"masked_value": FromStrategy("masked_value")}
    op: ClassVar[str] = ""
    pse_note: ClassVar[str] = ""
    per_head_masks: ClassVar[bool] = False
    key_lengths: ClassVar[bool] = False

    def device_reasons(self) -> List[Reason]:
        return npu_device_reasons(self.op)

    def target_reasons(self, target: Target) -> List[Reason]:
        return chip_reasons(target.chip, self.op)

    def fused(self, call: AttentionCall, target: Target) -> bool:
        return True

    def float_mask_reasons(self, call: AttentionCall) -> List[Reason]:
        return float_mask_reasons(call, self.name, self._options["masked_value"], self.pse_note, self.supports_grad)

    def reads_mask_values(self, device_type: str) -> bool:
        return self.device_types is None or device_type in self.device_types

    def plan_bytes(self, call: AttentionCall) -> int:
        """The bool mask built for the call: 0 without a mask, for causal alone and for key lengths; no scores."""
        return mask_bytes(call, self._options["masked_value"], self.key_lengths)

    def op_mask(self, call: AttentionCall) -> AscendMask:
        """What the op gets for ``call``'s mask (see :func:`ascend_mask`)."""
        return ascend_mask(call, self.per_head_masks, self._options["masked_value"], self.key_lengths)
