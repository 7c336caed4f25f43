"""Every attention-mask form found in users' code, turned into the one form the kernels take.

Users' masks come with three different polarities and several shapes: SDPA's bool keep-masks (True = take part),
Ascend's bool "masked" masks (True = left out), additive float masks (0 / -inf / ``finfo.min`` / -10000),
key-padding masks ``(batch, key_len)`` with 1 = valid token (DiT's scene mask), legacy ``(batch*heads, q_len,
key_len)`` masks from diffusers' ``prepare_attention_mask``, 2-D masks. Mixing them up does not fail: it silently
attends to padding or masks the wrong tokens. So every conversion here says its polarity in its name, and polarity
flips happen in this module and nowhere else.

The canonical form (:class:`CanonicalMask`) is a bool *keep* tensor (True = the key takes part) that broadcasts
against the 4-D scores ``(batch, heads, q_len, key_len)``, plus, for float masks, the additive *bias* itself.

An additive value at or below :data:`MASKED_AT_OR_BELOW` counts as masked, exactly like ``-inf``: that covers
``finfo.min`` masks in float16, bfloat16 and float32 alike, so a row whose keys are all masked gives zeros — the
same answer as ``-inf`` — instead of SDPA's uniform average over masked keys or, in float16, ``-inf`` + NaN.

Kernels whose ops take bool masks only (the Ascend ops; SDPA on an NPU, which sends float masks to its slow path)
convert a float mask that is a *pure mask* — 0 where kept, masked values elsewhere — into a bool one, exactly
(:func:`float_mask_facts`, :func:`mask_keep`); a user may declare one more masking value (``masked_value``, e.g.
diffusers' ``-10000.0``), compared exactly in the mask's dtype. Whether a mask is pure is read from its values (one
device synchronisation), so it is decided once per mask tensor and kept (:func:`memoized`, keyed weakly on the
caller's tensor and its version counter), as is every form converted from it: a model whose layers all receive the
same mask tensor pays for one check and one conversion per forward, and an in-place change is seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Optional, Sequence, Tuple, TypeVar

import torch
from torch import Tensor

from ..errors import AttentionInputError
from ..weak import Memo, tensor_version

T = TypeVar("T")

#: Half of float16's most negative finite value (-65504). Additive values at or below it count as masked.
MASKED_AT_OR_BELOW = -32752.0

__all__ = [
    "MASKED_AT_OR_BELOW",
    "CanonicalMask",
    "FloatMaskFacts",
    "additive_from_keep",
    "canonicalize",
    "causal_keep",
    "float_mask_facts",
    "key_padding_lengths",
    "keep_from_additive",
    "keep_from_binary",
    "keep_from_key_padding",
    "keep_from_masked",
    "mask_keep",
    "masked_from_keep",
    "memoized",
    "unfold_heads",
]


def _require_tensor(mask: object, argument: str = "mask") -> Tensor:
    if not isinstance(mask, Tensor):
        raise AttentionInputError(f"{argument} must be a torch.Tensor, got {type(mask).__name__}")
    return mask


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``, as error messages print dtypes."""
    return str(dtype).replace("torch.", "")


def keep_from_masked(mask: Tensor) -> Tensor:
    """Ascend polarity -> keep-mask: ``True``/nonzero means *masked out*, the result's ``True`` means *take part*.

    Accepts bool or integer (0/1) masks, as ``npu_fusion_attention`` and friends take them.
    """
    mask = _require_tensor(mask)
    if mask.dtype == torch.bool:
        return ~mask
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise AttentionInputError(
            f"keep_from_masked expects a bool or 0/1 integer mask (True/1 = masked), got {dtype_name(mask.dtype)}; "
            "for an additive float mask use keep_from_additive"
        )
    return mask == 0


def masked_from_keep(keep: Tensor) -> Tensor:
    """Keep-mask -> Ascend polarity (True = masked out), the form Ascend attention ops take."""
    keep = _require_tensor(keep, "keep")
    if keep.dtype != torch.bool:
        raise AttentionInputError(f"masked_from_keep expects a bool keep-mask, got {dtype_name(keep.dtype)}")
    return ~keep


def keep_from_additive(mask: Tensor, masked_at_or_below: float = MASKED_AT_OR_BELOW) -> Tensor:
    """Additive float mask -> keep-mask: entries at or below ``masked_at_or_below`` (and ``-inf``) are masked.

    Only for masks that are *pure masks* (0 where kept): any finite bias on kept positions is dropped. Pass
    ``masked_at_or_below=-10000.0`` for diffusers-style ``(1 - mask) * -10000.0`` masks.
    """
    mask = _require_tensor(mask)
    if not mask.dtype.is_floating_point:
        raise AttentionInputError(f"keep_from_additive expects a float additive mask, got {dtype_name(mask.dtype)}")
    return mask > masked_at_or_below


def additive_from_keep(keep: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Keep-mask -> additive float mask: 0 where kept, ``-inf`` where masked."""
    keep = _require_tensor(keep, "keep")
    if keep.dtype != torch.bool:
        raise AttentionInputError(f"additive_from_keep expects a bool keep-mask, got {dtype_name(keep.dtype)}")
    if not dtype.is_floating_point:
        raise AttentionInputError(f"additive_from_keep needs a floating dtype, got {dtype_name(dtype)}")
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))


def keep_from_binary(mask: Tensor) -> Tensor:
    """A 0/1 mask where nonzero means *take part* (bool, integer or float 0.0/1.0) -> keep-mask.

    This is the form tokenizers' ``attention_mask`` uses. Passing such a float mask straight to SDPA would *add*
    0 and 1 to the scores and mask nothing; this conversion says what it means.
    """
    mask = _require_tensor(mask)
    if mask.dtype == torch.bool:
        return mask
    return mask != 0


def keep_from_key_padding(mask: Tensor) -> Tensor:
    """Key-padding mask ``(batch, key_len)`` with 1/True = valid token -> keep-mask ``(batch, 1, 1, key_len)``.

    The DiT scene mask and tokenizers' attention masks have this form. Without the reshape, SDPA's right-aligned
    broadcasting would read ``(batch, key_len)`` as ``(q_len, key_len)``.
    """
    mask = _require_tensor(mask)
    if mask.dim() != 2:
        raise AttentionInputError(
            f"keep_from_key_padding expects a (batch, key_len) mask, got shape {tuple(mask.shape)}"
        )
    return keep_from_binary(mask)[:, None, None, :]


def unfold_heads(mask: Tensor, heads: int) -> Tensor:
    """Legacy ``(batch*heads, q_len|1, key_len)`` mask -> ``(batch, heads, q_len|1, key_len)``.

    diffusers' ``prepare_attention_mask`` and the ControlVideo-era ``_attention`` code fold heads into the batch
    (``repeat_interleave(heads, dim=0)``, batch-major). Dtype and polarity are left as they are.
    """
    mask = _require_tensor(mask)
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise AttentionInputError(f"heads must be a positive int, got {heads!r}")
    if mask.dim() != 3:
        raise AttentionInputError(
            f"unfold_heads expects a (batch*heads, q_len, key_len) mask, got shape {tuple(mask.shape)}"
        )
    if mask.shape[0] % heads:
        raise AttentionInputError(
            f"unfold_heads: the mask's first dimension ({mask.shape[0]}) is not a multiple of heads={heads}"
        )
    return mask.reshape(mask.shape[0] // heads, heads, mask.shape[1], mask.shape[2])


def causal_keep(
    q_len: int, key_len: int, device: torch.device | str | None = None, q_start: int = 0, key_start: int = 0
) -> Tensor:
    """Top-left-aligned causal keep-mask, as ``is_causal=True`` in SDPA: query ``i`` sees keys ``j <= i``.

    ``q_start``/``key_start`` give the block's offsets so chunked kernels can build one block at a time.
    """
    rows = torch.arange(q_start, q_start + q_len, device=device)
    cols = torch.arange(key_start, key_start + key_len, device=device)
    return cols[None, :] <= rows[:, None]


@dataclass(frozen=True, eq=False)
class CanonicalMask:
    """A mask in the one form kernels take.

    ``keep``: bool, True = the key takes part, 4-D and broadcastable to ``(batch, heads, q_len, key_len)`` (size-1
    dimensions are kept as they are: nothing is expanded). ``bias``: the additive float mask when the user gave one
    (same shape as ``keep``), else None; kernels add it to the scaled scores and then apply ``keep``.
    """

    keep: Tensor
    bias: Optional[Tensor]
    #: The caller's mask in 4-D, as canonicalised, when ``bias`` / ``keep`` are not it (a call cast to another dtype
    #: keeps the original here): what a mask's purity and converted forms are read from and kept by.
    origin: Optional[Tensor] = None

    @property
    def source(self) -> Tensor:
        """The caller's mask in 4-D (a view of the tensor the caller passed, where reshaping allowed one)."""
        if self.origin is not None:
            return self.origin
        return self.bias if self.bias is not None else self.keep

    @property
    def kind(self) -> str:
        return "float" if self.bias is not None else "bool"

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.keep.shape)

    @property
    def per_head(self) -> bool:
        """True when the mask differs between heads (its head dimension is not 1)."""
        return self.keep.shape[1] != 1


def _broadcast_hint(mask_shape: Tuple[int, ...], target: Tuple[int, int, int, int]) -> str:
    batch, heads, q_len, key_len = target
    if len(mask_shape) == 2 and mask_shape == (batch, key_len):
        return "; for a (batch, key_len) key-padding mask use npu_port.masks.keep_from_key_padding(mask)"
    if len(mask_shape) == 3 and mask_shape[0] == batch * heads and heads > 1:
        return f"; for a legacy (batch*heads, q_len, key_len) mask use npu_port.masks.unfold_heads(mask, heads={heads})"
    return ""


def canonicalize(attn_mask: Optional[Tensor], target: Sequence[int], device: torch.device) -> Optional[CanonicalMask]:
    """Check ``attn_mask`` against the 4-D scores shape ``target`` and return its canonical form.

    ``attn_mask`` follows SDPA's rules: bool = keep-mask, float = additive, broadcast from the right. Integer
    masks are refused because their polarity is ambiguous (Ascend: 1 = masked; tokenizers: 1 = keep).
    """
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, Tensor):
        raise AttentionInputError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    target = tuple(int(t) for t in target)
    if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
        raise AttentionInputError(
            f"attn_mask dtype {dtype_name(attn_mask.dtype)} is ambiguous: pass a bool mask (True = take part) "
            "or a float additive mask (0 = keep, -inf = masked). Convert with npu_port.masks.keep_from_masked(mask) "
            "if 1 means masked (Ascend ops), or npu_port.masks.keep_from_binary(mask) if 1 means keep "
            "(tokenizer attention_mask)"
        )
    if attn_mask.device != device:
        raise AttentionInputError(f"attn_mask is on {attn_mask.device} but query is on {device}")
    shape = tuple(attn_mask.shape)
    fits = len(shape) <= 4 and all(m in (1, t) for m, t in zip(reversed(shape), reversed(target)))
    if not fits:
        raise AttentionInputError(
            f"attn_mask of shape {shape} does not broadcast to the scores' shape {target} "
            "(batch, heads, q_len, key_len); masks broadcast from the right, as in "
            f"torch.nn.functional.scaled_dot_product_attention{_broadcast_hint(shape, target)}"
        )
    mask4 = attn_mask.reshape((1,) * (4 - len(shape)) + shape)
    if mask4.dtype == torch.bool:
        return CanonicalMask(keep=mask4, bias=None)
    return CanonicalMask(keep=mask4 > MASKED_AT_OR_BELOW, bias=mask4)


# ---- float masks that are pure masks, and the forms converted from a mask, kept per mask tensor ---------------------

#: Everything derived from a user's mask tensor and kept for the next call: purity, key lengths, converted masks.
MEMO = Memo(capacity=16)


def memoized(mask: CanonicalMask, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` for ``mask``, kept under ``key`` while the caller's tensor lives and is unchanged.

    The entry is keyed on the tensor the caller passed (the base of the 4-D view the call holds: a reshape makes a
    new view at every call) and on which part of it the view shows, so the same mask passed to every layer is
    found again; its version counter tells an in-place change. A mask made under ``torch.inference_mode()`` has
    no version counter: its forms are computed at every call. ``compute`` must not return a view of the mask."""
    source = mask.source
    root = source._base if source._base is not None else source
    where = (source.storage_offset(), tuple(source.shape), source.stride(), source.dtype)
    return MEMO.get(root, tensor_version(source), (where, key), compute)


def _exactly(masked_value: Optional[float], dtype: torch.dtype) -> Optional[float]:
    """``masked_value`` as the mask's dtype holds it (bfloat16 holds -10000.0 as -9984.0, which is what a diffusers
    mask computed in bfloat16 contains)."""
    if masked_value is None:
        return None
    return torch.tensor(masked_value, dtype=dtype).item()


def _masked_entries(values: Tensor, masked_value: Optional[float]) -> Tensor:
    masked = values <= MASKED_AT_OR_BELOW
    declared = _exactly(masked_value, values.dtype)
    if declared is not None and declared > MASKED_AT_OR_BELOW:
        masked = masked | (values == declared)
    return masked


def mask_keep(mask: CanonicalMask, masked_value: Optional[float] = None) -> Tensor:
    """The keep-mask of ``mask`` with ``masked_value`` counted as masked too (a float mask's entries equal to it, in
    the mask's dtype); a bool mask's own. Read from the caller's values (:attr:`CanonicalMask.source`)."""
    source = mask.source
    if source.dtype == torch.bool:
        return source
    if masked_value is None:
        return mask.keep  # canonicalize's; a cast call keeps it
    return ~_masked_entries(source, masked_value)


@dataclass(frozen=True)
class FloatMaskFacts:
    """What a float mask's values say. ``pure``: every entry is 0 or masked (``-inf``, at or below
    :data:`MASKED_AT_OR_BELOW`, or the declared ``masked_value``), so a bool mask says the same, exactly.
    Otherwise ``example`` is one value that makes it a bias (a non-zero value on a kept position, or NaN).
    ``any_masked``: whether any entry is masked (:func:`mask_keep` is not all True): a bias without one needs no
    bool mask beside it."""

    pure: bool
    example: Optional[float] = None
    any_masked: bool = True


def float_mask_facts(mask: CanonicalMask, masked_value: Optional[float] = None) -> Optional[FloatMaskFacts]:
    """Whether ``mask`` is a pure mask (None for a bool mask); decided once per mask tensor and version (one device
    synchronisation) and kept (:func:`memoized`)."""
    if mask.bias is None:
        return None

    def decide() -> FloatMaskFacts:
        values = mask.source.detach()
        bias = torch.isnan(values) | (~_masked_entries(values, masked_value) & (values != 0))
        is_bias, any_masked = torch.stack([bias.any(), ~mask_keep(mask, masked_value).all()]).tolist()  # one sync
        if not is_bias:
            return FloatMaskFacts(True, any_masked=any_masked)
        return FloatMaskFacts(False, values[bias][0].item(), any_masked)

    return memoized(mask, ("facts", masked_value), decide)


def key_padding_lengths(mask: CanonicalMask, masked_value: Optional[float] = None) -> Optional[Tuple[int, ...]]:
    """For a key-padding mask — shape ``(B|1, 1, 1, Skv)`` whose kept keys are a prefix ``0 .. L_b - 1`` in every
    batch item (a tokenizer's right padding) — the lengths ``(L_b, ...)``; None for any other mask. For a float
    mask, ask only once :func:`float_mask_facts` says it is pure. Kept per mask tensor (:func:`memoized`)."""
    source = mask.source
    if source.dim() != 4 or source.shape[1] != 1 or source.shape[2] != 1:
        return None

    def lengths() -> Optional[Tuple[int, ...]]:
        keep = mask_keep(mask, masked_value)[:, 0, 0, :]
        counts = keep.sum(dim=-1)
        prefix = (torch.arange(keep.shape[-1], device=keep.device) < counts[:, None]) == keep
        found = torch.cat([counts, prefix.all().reshape(1).to(counts.dtype)]).tolist()  # one synchronisation
        return tuple(int(n) for n in found[:-1]) if found[-1] else None

    return memoized(mask, ("lengths", masked_value), lengths)


def describe_masked(masked_value: Optional[float]) -> str:
    """What counts as masked in a float mask, as messages say it."""
    declared = "" if masked_value is None else f", or the declared masked_value {masked_value:g}"
    return f"-inf, values <= {MASKED_AT_OR_BELOW:g}{declared}"
