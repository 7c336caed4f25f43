"""One attention call, checked once and described once.

Kernels never look at raw arguments: :meth:`AttentionCall.from_arguments` validates them with SDPA's rules and
messages that name the problem, normalises the layout to 4-D ``(batch, heads, seq, head_dim)`` and the mask to its
canonical form. Every kernel's ``reasons(call)`` reads only this object (as xformers' ops read ``Inputs``), so the
same facts explain a refusal in an exception, in ``npu-port kernels`` and in ``auto``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..errors import AttentionInputError
from .masks import CanonicalMask, canonicalize, causal_keep, dtype_name


def _check_tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise AttentionInputError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.dtype.is_floating_point:
        raise AttentionInputError(
            f"{name} has dtype {dtype_name(value.dtype)}; attention needs float16, bfloat16, float32 or float64"
        )
    if value.dim() < 3:
        raise AttentionInputError(
            f"{name} must have at least 3 dimensions (..., heads, seq_len, head_dim), got shape {tuple(value.shape)}"
        )
    return value


def _flatten_mask_batch(mask: Tensor, batch_dims: Tuple[int, ...], ndim: int) -> Tensor:
    """Bring a mask for ``(*batch_dims, H, Sq, Skv)`` scores to 4-D ``(prod(batch_dims)|1, H|1, Sq|1, Skv|1)``."""
    if mask.dim() > ndim:
        raise AttentionInputError(
            f"attn_mask has {mask.dim()} dimensions but the scores have {ndim}; masks broadcast from the right"
        )
    mask = mask.reshape((1,) * (ndim - mask.dim()) + tuple(mask.shape))
    lead = tuple(mask.shape[: ndim - 3])
    if all(size == 1 for size in lead):
        return mask.reshape((1,) + tuple(mask.shape[ndim - 3 :]))
    if any(size not in (1, want) for size, want in zip(lead, batch_dims)):
        raise AttentionInputError(
            f"attn_mask of shape {tuple(mask.shape)} does not broadcast over the batch dimensions {batch_dims}"
        )
    mask = mask.expand(batch_dims + tuple(mask.shape[ndim - 3 :]))
    return mask.reshape((math.prod(batch_dims),) + tuple(mask.shape[ndim - 3 :]))


@dataclass(eq=False)
class AttentionCall:
    """A validated attention call in 4-D layout; what every kernel's ``reasons`` and ``run`` read.

    Treat it as immutable (derive a changed call with ``dataclasses.replace``). It is not a frozen dataclass only
    because frozen construction costs a microsecond per attention call.

    ``query`` is ``(B, Hq, Sq, D)``, ``key`` ``(B, Hkv, Skv, D)``, ``value`` ``(B, Hkv, Skv, Dv)``; ``Hq`` is a
    multiple of ``Hkv`` (grouped-query attention shares each key/value head across ``Hq // Hkv`` query heads,
    ``repeat_interleave`` order). ``scale`` is resolved (``1/sqrt(D)`` when the caller gave None).
    """

    query: Tensor
    key: Tensor
    value: Tensor
    mask: Optional[CanonicalMask]
    is_causal: bool
    dropout_p: float
    scale: float
    enable_gqa: bool
    output_shape: Tuple[int, ...]
    #: whether the caller wants the log-sum-exp with the output (kernels that cannot return it refuse the call)
    return_lse: bool = False

    # ---- construction -------------------------------------------------------------------------------------------

    @classmethod
    def from_arguments(
        cls,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Optional[Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
    ) -> "AttentionCall":
        """Validate SDPA-style arguments (same semantics, clearer errors) and build the call.

        This runs on every attention call (thousands per image), so each shape is read once and the checks are
        ordered to cost a few comparisons when the input is valid; the messages are built only on failure.
        """
        query = _check_tensor("query", query)
        key = _check_tensor("key", key)
        value = _check_tensor("value", value)
        dtype = query.dtype
        if not (dtype == key.dtype == value.dtype):
            raise AttentionInputError(
                "query, key and value must share one dtype; got "
                f"query {dtype_name(query.dtype)}, key {dtype_name(key.dtype)}, value {dtype_name(value.dtype)}"
            )
        device = query.device
        if not (device == key.device == value.device):
            raise AttentionInputError(
                f"query, key and value must be on one device; got {query.device}, {key.device}, {value.device}"
            )
        ndim = query.dim()
        if not (ndim == key.dim() == value.dim()):
            raise AttentionInputError(
                "query, key and value must have the same number of dimensions (..., heads, seq_len, head_dim); "
                f"got {query.dim()}, {key.dim()}, {value.dim()}"
            )
        if is_causal is not False and is_causal is not True:
            raise AttentionInputError(f"is_causal must be True or False, got {is_causal!r}")
        if enable_gqa is not False and enable_gqa is not True:
            raise AttentionInputError(f"enable_gqa must be True or False, got {enable_gqa!r}")
        if return_lse is not False and return_lse is not True:
            raise AttentionInputError(f"return_lse must be True or False, got {return_lse!r}")
        if not (type(dropout_p) is float and 0.0 <= dropout_p <= 1.0):  # the common case first: a float in range
            if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p <= 1.0:
                raise AttentionInputError(f"dropout_p must be a number in [0, 1], got {dropout_p!r}")
        if scale is not None and not (type(scale) is float and math.isfinite(scale)):
            if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
                raise AttentionInputError(f"scale must be None or a finite number, got {scale!r}")

        q_shape, k_shape, v_shape = query.shape, key.shape, value.shape
        if ndim == 4:
            if not (k_shape[0] == q_shape[0] == v_shape[0]):
                cls._batch_mismatch(q_shape, k_shape, v_shape)
        elif k_shape[:-3] != q_shape[:-3] or v_shape[:-3] != q_shape[:-3]:
            cls._batch_mismatch(q_shape, k_shape, v_shape)
        heads, q_len, head_dim = q_shape[-3:]
        kv_heads, key_len, key_dim = k_shape[-3:]
        if v_shape[-3] != kv_heads or v_shape[-2] != key_len:
            raise AttentionInputError(
                "key and value must have the same heads and sequence length; got "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if key_dim != head_dim:
            raise AttentionInputError(
                f"query and key must have the same head_dim (last dimension); got {head_dim} and {key_dim}"
            )
        if head_dim < 1:
            raise AttentionInputError("head_dim (the last dimension of query and key) must be at least 1")
        if heads != kv_heads:
            if not enable_gqa:
                raise AttentionInputError(
                    f"query has {heads} heads but key/value have {kv_heads}; pass enable_gqa=True to share "
                    "key/value heads across query heads (grouped-query attention)"
                )
            if kv_heads == 0 or heads % kv_heads:
                raise AttentionInputError(
                    f"enable_gqa needs the query heads ({heads}) to be a multiple of the key/value heads ({kv_heads})"
                )

        output_shape = q_shape[:-1] + v_shape[-1:]
        if ndim == 4:
            batch = q_shape[0]
        else:  # 3-D inputs get a batch of 1, >4-D inputs one batch of all leading dims
            batch_dims = tuple(q_shape[:-3])
            batch = math.prod(batch_dims)
            query = query.reshape((batch,) + tuple(q_shape[-3:]))
            key = key.reshape((batch,) + tuple(k_shape[-3:]))
            value = value.reshape((batch,) + tuple(v_shape[-3:]))
            if attn_mask is not None and isinstance(attn_mask, Tensor):
                attn_mask = _flatten_mask_batch(attn_mask, batch_dims, ndim)
        mask = None if attn_mask is None else canonicalize(attn_mask, (batch, heads, q_len, key_len), device)
        return cls(
            query=query,
            key=key,
            value=value,
            mask=mask,
            is_causal=is_causal,
            dropout_p=float(dropout_p),
            scale=float(scale) if scale is not None else 1.0 / math.sqrt(head_dim),
            enable_gqa=enable_gqa,
            output_shape=tuple(output_shape),
            return_lse=return_lse,
        )

    @staticmethod
    def _batch_mismatch(q_shape: torch.Size, k_shape: torch.Size, v_shape: torch.Size) -> None:
        raise AttentionInputError(
            "query, key and value must have the same batch dimensions; got "
            f"query {tuple(q_shape)}, key {tuple(k_shape)}, value {tuple(v_shape)}"
        )

    # ---- facts kernels ask about --------------------------------------------------------------------------------

    @property
    def batch(self) -> int:
        return self.query.shape[0]

    @property
    def heads(self) -> int:
        return self.query.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.key.shape[1]

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 unless grouped-query attention)."""
        return self.heads // self.kv_heads

    @property
    def q_len(self) -> int:
        return self.query.shape[2]

    @property
    def key_len(self) -> int:
        return self.key.shape[2]

    @property
    def head_dim(self) -> int:
        return self.query.shape[3]

    @property
    def value_dim(self) -> int:
        return self.value.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.query.dtype

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def needs_grad(self) -> bool:
        """True when autograd will want gradients through this call."""
        if not torch.is_grad_enabled():
            return False
        tensors = [self.query, self.key, self.value]
        if self.mask is not None and self.mask.bias is not None:
            tensors.append(self.mask.bias)
        return any(t.requires_grad for t in tensors)

    @property
    def is_empty(self) -> bool:
        """No queries, no keys, or values of width 0: the answer is zeros of the output's shape, on every kernel."""
        return self.query.numel() == 0 or self.key_len == 0 or self.value_dim == 0

    # ---- helpers shared by kernels ------------------------------------------------------------------------------

    def keep_mask(self) -> Optional[Tensor]:
        """The 4-D keep-mask with causality folded in (materialised ``(…, Sq, Skv)`` when causal), or None."""
        keep = self.mask.keep if self.mask is not None else None
        if not self.is_causal:
            return keep
        causal = causal_keep(self.q_len, self.key_len, self.device)[None, None]
        return causal if keep is None else keep & causal

    def empty_output(self) -> Tensor:
        """The answer when there are no queries or no keys: zeros (as SDPA gives), still attached to autograd."""
        out = self.query.new_zeros(self.output_shape)
        if self.needs_grad:
            out = out + 0.0 * (self.query.sum() + self.key.sum() + self.value.sum())
        return out

    def empty_lse(self) -> Tensor:
        """The log-sum-exp of an empty call: -inf (no key contributes), float32, in the caller's row layout."""
        return self.query.new_full(self.output_shape[:-1], float("-inf"), dtype=torch.float32)

    def restore_lse_shape(self, lse: Tensor) -> Tensor:
        """Give the ``(B, Hq, Sq)`` log-sum-exp back in the caller's layout (``(..., heads, q_len)``)."""
        shape = self.output_shape[:-1]
        return lse if tuple(lse.shape) == shape else lse.reshape(shape)

    def restore_shape(self, out: Tensor) -> Tensor:
        """Give the output back in the caller's layout (3-D or >4-D inputs were flattened to 4-D)."""
        return out if tuple(out.shape) == self.output_shape else out.reshape(self.output_shape)

    def describe(self) -> str:
        """One line naming everything a kernel decides on, used in every error message."""
        if self.mask is None:
            mask = "no mask"
        else:
            mask = f"{self.mask.kind} mask {self.mask.shape}"
        return (
            f"query {tuple(self.query.shape)} {dtype_name(self.dtype)} on {self.device}, "
            f"key {tuple(self.key.shape)}, value {tuple(self.value.shape)}, {mask}, "
            f"is_causal={self.is_causal}, dropout_p={self.dropout_p:g}, scale={self.scale:.4g}"
            + (", grad" if self.needs_grad else "")
            + (", return_lse" if self.return_lse else "")
        )
