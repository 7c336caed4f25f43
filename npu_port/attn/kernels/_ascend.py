"""What the two Ascend attention kernels share: device presence, mask polarity and forms, causal masks, limits.

Ascend's attention ops take masks with the opposite polarity to SDPA (True / 1 = masked out) and in a few fixed
shapes, and they *ignore* ``sparse_mode`` / ``next_tockens`` when no mask is passed — so causal attention needs the
compressed 2048 x 2048 upper-triangular mask plus ``sparse_mode=2`` (top-left, SDPA's alignment). Rows whose keys
are all masked are "invalid rows" whose result the docs leave undefined; as for SDPA, they get their keys back
before the op and are zeroed after it, which needs no slower ``inner_precise`` mode.

The ops take bool masks only. A float mask that is a pure mask (0 and masked values) becomes the bool mask, exactly;
a key-padding mask (kept keys a prefix of each batch item) becomes ``actual_seq_lengths_kv`` on the inference op, so
no ``(Sq, Skv)`` mask is built at all. A real bias goes to ``npu_fusion_attention``'s ``pse`` input (:func:`pse_shape`,
the bias's kept values with 0 where masked, in the query's dtype) and its masked entries to the bool mask. The docs
scale pse two ways — the formula ``softmax(scale * (pse + q k^T))``, the pse example ``softmax(scale * q k^T +
pse)`` — which agree when the op's ``scale`` is 1; so the op is called with ``scale=1`` and the query multiplied by
the call's scale beforehand, and the result is the same whichever formula the hardware follows. The inference op
refuses biases: its formula has no ``pse_shift`` at all. Purity and lengths are read once per mask tensor, and each
converted form (bool mask, pse) is built once per mask tensor and call signature
(:func:`npu_port.attn.masks.memoized`).
Sources: torch_npu 2.13.0 ``_op_plugin_docs.py`` (extracted in the project's reference notes).
"""

from __future__ import annotations

import math
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
PSE = "pse"  # a bias as npu_fusion_attention's pse, no mask (the bias masks nothing)
PSE_CAUSAL = "pse+causal"  # the bias as pse with the compressed causal mask, sparse_mode=2
PSE_FULL = "pse+full"  # the bias as pse, its masked entries (and causal) as the full bool mask
PSE_FORMS = (PSE, PSE_CAUSAL, PSE_FULL)


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
    #: The bias for npu_fusion_attention's ``pse`` (one of its documented shapes, the query's dtype); the op must
    #: then be called with ``scale=1`` and the query pre-scaled (:func:`pse_query`).
    pse: Optional[Tensor] = None


def mask_form(call: AttentionCall, masked_value: Optional[float], lengths: bool, pse: bool = False) -> str:
    """Which form ``call``'s mask takes (no tensor is built; a key-padding mask's lengths are read once per mask
    tensor). ``lengths``: whether the op takes ``actual_seq_lengths_kv`` in this layout (the inference op with BNSD;
    npu_fusion_attention takes lengths only in its TND varlen layout, which needs the tokens repacked, so it always
    gets the full mask). ``pse``: whether the op takes a bias as ``pse`` (npu_fusion_attention); a bias that masks
    nothing then needs no bool mask, or only the compressed causal one."""
    if call.mask is None:
        if not call.is_causal:
            return NO_MASK
        return CAUSAL if call.q_len > 1 else FULL  # with one query the ops ignore sparse_mode
    facts = float_mask_facts(call.mask, masked_value)
    if pse and facts is not None and not facts.pure:
        if facts.any_masked or (call.is_causal and call.q_len == 1):
            return PSE_FULL
        return PSE_CAUSAL if call.is_causal else PSE
    if lengths and not (call.is_causal and call.q_len == 1) and _pure(call, masked_value):
        if key_padding_lengths(call.mask, masked_value) is not None:
            return LENGTHS_CAUSAL if call.is_causal else LENGTHS
    return FULL


def _pure(call: AttentionCall, masked_value: Optional[float]) -> bool:
    facts = float_mask_facts(call.mask, masked_value)
    return facts is None or facts.pure


def ascend_mask(
    call: AttentionCall, per_head: bool, masked_value: Optional[float] = None, lengths: bool = False, pse: bool = False
) -> AscendMask:
    """The op's mask for ``call`` in Ascend polarity (True = masked): none, the compressed causal mask, the key
    lengths, or the full mask, and with ``pse`` a bias as the op's ``pse`` — converted once per mask tensor and call
    signature (:func:`memoized`), so the layers of a model that share one mask share one conversion.

    ``per_head`` says whether the op accepts a ``(B, N, Sq, Skv)`` mask; otherwise the mask is
    ``(B|1, 1, Sq, Skv)`` (callers refuse per-head masks in their reasons).
    """
    if call.mask is not None and not _pure(call, masked_value):
        if not pse:
            raise KernelRuntimeError(
                f"the Ascend kernels take pure float masks only; reasons() refuses this call ({call.describe()})"
            )
        if call.needs_grad and call.mask.bias.requires_grad:  # a router's cached choice must not drop its gradient
            raise KernelRuntimeError(
                f"a bias that requires grad cannot be npu_fusion_attention's pse; reasons() refuses this call "
                f"({call.describe()})"
            )
    form = mask_form(call, masked_value, lengths, pse)
    if form in PSE_FORMS:
        return _pse_mask(call, form, masked_value, per_head)
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


def _pse_mask(call: AttentionCall, form: str, masked_value: Optional[float], per_head: bool) -> AscendMask:
    signature = ("ascend-pse", masked_value, call.dtype, call.batch, call.heads, call.q_len, call.key_len)
    bias = memoized(call.mask, signature, lambda: _pse(call, masked_value))
    if form == PSE:
        return AscendMask(form, None, None, SPARSE_DEFAULT_MASK, pse=bias)
    if form == PSE_CAUSAL:
        return AscendMask(form, compressed_causal_mask(call.device), None, SPARSE_LEFT_UP_CAUSAL, pse=bias)
    signature = ("ascend-full", masked_value, per_head, call.is_causal, call.batch, call.q_len, call.key_len)
    masked, row_has_key = memoized(call.mask, signature, lambda: _full_mask(call, masked_value, per_head))
    return AscendMask(form, masked, row_has_key, SPARSE_DEFAULT_MASK, pse=bias)


def pse_shape(shape: Tuple[int, ...], call: AttentionCall) -> Tuple[int, int, int, int]:
    """The smallest of npu_fusion_attention's documented pse shapes — BNSS, BN1Skv, 1NSS — that a
    ``(B|1, N|1, Sq|1, Skv|1)`` bias broadcasts to (BNSS when the bias is (B, 1, Sq, Skv): 1NSS cannot hold
    a per-batch bias and no B1SS form is documented)."""
    batch, heads, q_len, key_len = call.batch, call.heads, call.q_len, call.key_len
    fits = [(batch, heads, q_len, key_len)]
    if shape[2] == 1:
        fits.append((batch, heads, 1, key_len))
    if shape[0] == 1:
        fits.append((1, heads, q_len, key_len))
    return min(fits, key=lambda s: s[0] * s[1] * s[2] * s[3])


def _pse(call: AttentionCall, masked_value: Optional[float]) -> Tensor:
    """The bias's kept values (0 where masked: the bool mask masks those), in the query's dtype as the op requires
    (a wider mask is rounded to it, as SDPA rounds it), expanded to a documented shape."""
    source = call.mask.source.detach()
    kept = source.masked_fill(~mask_keep(call.mask, masked_value), 0).to(call.dtype)
    return kept.expand(pse_shape(tuple(source.shape), call)).contiguous()


def pse_query(call: AttentionCall) -> Tensor:
    """The query for a call whose bias goes to ``pse``: multiplied by the call's scale (one elementwise multiply in
    its dtype, one rounding per element), so the op runs with ``scale=1``, where its two documented formulas agree.
    With a scale of 1 the query is passed as it is."""
    return call.query if call.scale == 1.0 else call.query * call.scale


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


def mask_bytes(call: AttentionCall, masked_value: Optional[float], lengths: bool, pse: bool = False) -> int:
    """Device bytes of the mask built for ``call``: the bool mask (one byte per entry; 0 when the op gets no mask,
    the key lengths or the compressed causal mask — one 2048 x 2048 mask per device, 4 MiB, shared by every call)
    and a bias's pse (its documented shape in the query's dtype; :func:`pse_shape`)."""
    form = mask_form(call, masked_value, lengths, pse)
    found = 0
    if form in PSE_FORMS:
        found += math.prod(pse_shape(tuple(call.mask.shape), call)) * call.query.element_size()
    if form in (FULL, PSE_FULL):
        batch, heads = (1, 1) if call.mask is None else _full_shape(tuple(call.mask.shape), call)
        found += batch * heads * call.q_len * call.key_len
    return found


def float_mask_reasons(
    call: AttentionCall, kernel: str, masked_value: Optional[float], pse_note: str, grad: bool, pse: str = ""
) -> List[Reason]:
    """Why an Ascend kernel cannot take ``call``'s float mask: it is a bias and the op's bias input is not used
    (``pse_note`` says why; ``pse`` names the op whose ``pse`` takes it, when one does), or, for the training op
    (``grad``), it requires a gradient that neither a bool mask nor ``pse`` carries. A pure mask is converted, so
    it is no reason."""
    facts = float_mask_facts(call.mask, masked_value)
    shape = tuple(call.mask.shape)
    if not facts.pure and not pse:
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
        why = (
            f"requires grad: as {kernel}'s bool mask it would get no gradient"
            if facts.pure
            else f"is a bias that requires grad: {kernel} passes it as {pse}'s pse, and no gradient for pse is "
            "documented"
        )
        return [
            Reason("mask", f"float mask {shape} {why}; use a kernel that adds it to the scores (sdpa, chunked, math)")
        ]
    return []


#: Why the inference op's bias input is not used (the ``pse_note`` of :func:`float_mask_reasons`).
FIA_PSE_NOTE = (
    "npu_fused_infer_attention_score's pse_shift input could carry a bias, but its documented formula "
    "softmax(scale * q k^T + atten_mask) has no pse, so how it is scaled is not documented (npu_fusion takes "
    "biases, as npu_fusion_attention's pse)"
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
    subclass names its ``op``, says whether that op takes per-head masks and key lengths, and whether it takes a
    bias as ``pse`` (``pse_bias``) or why not (``pse_note``)."""

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
    #: whether the op takes a bias through ``pse`` (see :func:`pse_query`); then ``op_mask`` may carry one
    pse_bias: ClassVar[bool] = False
    per_head_masks: ClassVar[bool] = False
    key_lengths: ClassVar[bool] = False

    def device_reasons(self) -> List[Reason]:
        return npu_device_reasons(self.op)

    def target_reasons(self, target: Target) -> List[Reason]:
        return chip_reasons(target.chip, self.op)

    def fused(self, call: AttentionCall, target: Target) -> bool:
        return True

    def float_mask_reasons(self, call: AttentionCall) -> List[Reason]:
        masked_value, pse = self._options["masked_value"], self.op if self.pse_bias else ""
        return float_mask_reasons(call, self.name, masked_value, self.pse_note, self.supports_grad, pse)

    def reads_mask_values(self, device_type: str) -> bool:
        return self.device_types is None or device_type in self.device_types

    def plan_bytes(self, call: AttentionCall) -> int:
        """The bool mask built for the call (0 without a mask, for causal alone and for key lengths) and a bias's
        pse; no scores."""
        return mask_bytes(call, self._options["masked_value"], self.key_lengths, self.pse_bias)

    def op_mask(self, call: AttentionCall) -> AscendMask:
        """What the op gets for ``call``'s mask (see :func:`ascend_mask`)."""
        return ascend_mask(call, self.per_head_masks, self._options["masked_value"], self.key_lengths, self.pse_bias)
