"""npu-port's stand-in for ``flash_attn`` (FlashAttention 2): the same functions, computed by ``npu_port.attention``.

Served as ``flash_attn`` and ``flash_attn.flash_attn_interface`` by the import hook when no working flash-attn is
installed (see :mod:`npu_port.dropins.install`). Layout ``(batch, seqlen, heads, head_dim)``; fewer key/value heads
than query heads is grouped-query attention. Semantics follow flash-attn's documentation:

- ``causal=True`` is aligned to the *bottom-right* corner: query ``i`` sees keys ``j <= i + seqlen_k - seqlen_q``
  (SDPA's ``is_causal`` is top-left; the two agree only when the lengths are equal);
- ``window_size=(left, right)``: query ``i`` sees keys in ``[i + seqlen_k - seqlen_q - left,
  i + seqlen_k - seqlen_q + right]``, -1 = unbounded on that side; with ``causal`` the right side is 0;
- a query with no key to see (bottom-right causal or a window when seqlen_q > seqlen_k) gives zeros;
- ``softmax_scale`` defaults to ``1 / sqrt(head_dim)``; ``dropout_p`` is applied as given (flash-attn leaves
  ``dropout_p if training else 0.0`` to the caller); ``deterministic`` changes nothing here.

The varlen functions take packed tokens ``(total, heads, head_dim)`` and ``cu_seqlens`` (int32, batch + 1); each
sequence attends only to its own keys (causal and windows per sequence, bottom-right). ``max_seqlen_*`` are not
needed and not checked. See :mod:`npu_port.dropins._attention` for how packed batches are attended (one call with a
block-diagonal mask, or one call per sequence for very large batches).

``flash_attn_with_kvcache`` writes new keys/values into the caches in place and attends to each item's filled
length. Unlike flash-attn, any floating dtype is accepted and head dims are not limited to 256. What cannot be
computed faithfully — ``alibi_slopes``, ``softcap``, ``return_attn_probs=True`` / ``return_softmax_lse=True``, a
paged ``block_table``, rotary embeddings inside the KV-cache call — raises :class:`~npu_port.errors.DropInError`
instead of returning something else.

On an Ascend 910B / 910C with flash-attn-npu installed, each call within that package's limits is handed to
``flash_attn_npu``'s function of the same name, arguments unchanged (softcap, ALiBi, the log-sum-exp and paged
caches included); the others are computed as above, and the reason is recorded. See
:mod:`npu_port.dropins.flash_attn_npu`.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from ..errors import AttentionInputError, DropInError
from ..reasons import Reason
from . import flash_attn_npu as _npu
from ._attention import attend_bshd, attend_dense, attend_packed, key_length_keep, window_bounds
from .install import CALLS


def _refuse(function: str, argument: str, why: str, instead: str, declined: Optional[Reason] = None) -> None:
    """Raise the drop-in's refusal; on an NPU it also says why flash_attn_npu did not take the call (``declined``:
    not installed, another chip, a limit of its own)."""
    npu = f" flash_attn_npu did not take this call: {declined}." if declined and declined.code != "device" else ""
    raise DropInError(
        f"{function}({argument}) is not supported by npu-port's flash_attn drop-in: {why}. {instead}, or install a "
        f"working flash-attn build (an installed flash-attn takes precedence over the drop-in).{npu}"
    )


def _check_supported(
    function: str,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    return_attn_probs: bool,
    block_table: Optional[Tensor] = None,
    declined: Optional[Reason] = None,
) -> None:
    if alibi_slopes is not None:
        _refuse(
            function,
            "alibi_slopes=...",
            "it does not add ALiBi biases",
            "Build the bias yourself and pass it as attn_mask to npu_port.attention(q, k, v, attn_mask=bias) with "
            "(batch, heads, seqlen, head_dim) tensors",
            declined,
        )
    if softcap:
        _refuse(
            function,
            f"softcap={softcap!r}",
            "it does not soft-cap the attention logits",
            "Call it with softcap=0.0",
            declined,
        )
    if return_attn_probs:
        _refuse(
            function,
            "return_attn_probs=True",
            "it returns the attention output only, not the softmax log-sum-exp or the attention probabilities",
            "Call it with return_attn_probs=False",
            declined,
        )
    if block_table is not None:
        _refuse(
            function,
            "block_table=...",
            "it does not read paged key/value caches",
            "Gather the pages into contiguous key/value tensors first",
            declined,
        )


def _dense(q, k, v, dropout_p, softmax_scale, causal, window_size) -> Tensor:
    """The emulation of :func:`flash_attn_func` (the packed forms unpack into it)."""
    left, right = window_bounds(causal, window_size, k.shape[1])
    return attend_dense(q, k, v, left=left, right=right, bottom_right=True, dropout_p=dropout_p, scale=softmax_scale)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, dropout_p, softmax_scale, causal, window_size):
    """The emulation of :func:`flash_attn_varlen_func` (the packed forms unpack into it); ``max_seqlen_k`` bounds the
    window as in flash-attn's ``mha_varlen_fwd``."""
    left, right = window_bounds(causal, window_size, max_seqlen_k)
    return attend_packed(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        left=left,
        right=right,
        bottom_right=True,
        dropout_p=dropout_p,
        scale=softmax_scale,
    )


@CALLS.counts_calls
def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Tensor:
    """``q`` ``(B, Sq, H, D)``, ``k``/``v`` ``(B, Skv, H_kv, D)`` -> ``(B, Sq, H, D)``; see the module docstring."""
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_func"
    npu, declined = _npu.dense(function, q, k, v, dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes)
    if npu is not None:
        return npu.flash_attn_func(**passed)
    _check_supported(function, softcap, alibi_slopes, return_attn_probs, declined=declined)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size)


@CALLS.counts_calls
def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Tensor:
    """``qkv`` ``(B, S, 3, H, D)`` -> ``(B, S, H, D)``."""
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_qkvpacked_func"
    q, k, v = qkv.unbind(dim=2)
    npu, declined = _npu.dense(function, q, k, v, dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes)
    if npu is not None:
        return npu.flash_attn_qkvpacked_func(**passed)
    _check_supported(function, softcap, alibi_slopes, return_attn_probs, declined=declined)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size)


@CALLS.counts_calls
def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Tensor:
    """``q`` ``(B, Sq, H, D)``, ``kv`` ``(B, Skv, 2, H_kv, D)`` -> ``(B, Sq, H, D)``."""
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_kvpacked_func"
    k, v = kv.unbind(dim=2)
    npu, declined = _npu.dense(function, q, k, v, dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes)
    if npu is not None:
        return npu.flash_attn_kvpacked_func(**passed)
    _check_supported(function, softcap, alibi_slopes, return_attn_probs, declined=declined)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size)


@CALLS.counts_calls
def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[Tensor] = None,
) -> Tensor:
    """``q`` ``(total_q, H, D)``, ``k``/``v`` ``(total_k, H_kv, D)``, ``cu_seqlens_*`` ``(B + 1,)`` -> ``(total_q,
    H, D)``; sequence ``b`` is ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` and sees only its own keys."""
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_varlen_func"
    npu, declined = _npu.varlen(
        function,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        dropout_p=dropout_p,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        block_table=block_table,
    )
    if npu is not None:
        return npu.flash_attn_varlen_func(**passed)
    _check_supported(function, softcap, alibi_slopes, return_attn_probs, block_table, declined)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, dropout_p, softmax_scale, causal, window_size)


@CALLS.counts_calls
def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Tensor:
    """``qkv`` ``(total, 3, H, D)`` -> ``(total, H, D)``."""
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_varlen_qkvpacked_func"
    q, k, v = qkv.unbind(dim=1)
    npu, declined = _npu.varlen(
        function, q, k, v, cu_seqlens, cu_seqlens, dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes
    )
    if npu is not None:
        return npu.flash_attn_varlen_qkvpacked_func(**passed)
    _check_supported(function, softcap, alibi_slopes, return_attn_probs, declined=declined)
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, window_size)


@CALLS.counts_calls
def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Tensor:
    """``q`` ``(total_q, H, D)``, ``kv`` ``(total_k, 2, H_kv, D)`` -> ``(total_q, H, D)``."""
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_varlen_kvpacked_func"
    k, v = kv.unbind(dim=1)
    npu, declined = _npu.varlen(
        function, q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes
    )
    if npu is not None:
        return npu.flash_attn_varlen_kvpacked_func(**passed)
    _check_supported(function, softcap, alibi_slopes, return_attn_probs, declined=declined)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, dropout_p, softmax_scale, causal, window_size)


@CALLS.counts_calls
def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Union[None, int, Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Tensor:
    """Decoding with a KV cache: ``q`` ``(B, Sq, H, D)``, ``k_cache``/``v_cache`` ``(B, S_cache, H_kv, D)``.

    When ``k``/``v`` ``(B, S_new, H_kv, D)`` are given they are written into the caches in place at
    ``cache_seqlens`` (an int or a ``(B,)`` tensor; None = the whole cache is filled, no new keys), as flash-attn
    does. Item ``b``
    then attends to its first ``cache_seqlens[b] + S_new`` cached keys; ``causal`` and ``window_size`` are aligned
    bottom-right to that length. Rotary embeddings, ``cache_batch_idx``, ``cache_leftpad`` and paged caches are
    refused (:class:`~npu_port.errors.DropInError`) unless flash_attn_npu takes the call (it reads ``cache_batch_idx``
    and paged caches; it has no rotary embedding and no ``cache_leftpad`` either).
    """
    passed = dict(locals())  # the arguments as given: what flash_attn_npu is handed, by name
    function = "flash_attn_with_kvcache"
    npu, declined = _npu.kvcache(
        function,
        q,
        k_cache,
        v_cache,
        k=k,
        v=v,
        cache_seqlens=cache_seqlens,
        rotary_cos=rotary_cos,
        cache_leftpad=cache_leftpad,
        block_table=block_table,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        num_splits=num_splits,
    )
    if npu is not None:
        return npu.flash_attn_with_kvcache(**passed)
    _check_supported(function, softcap, alibi_slopes, False, block_table, declined)
    if return_softmax_lse:
        _refuse(
            function,
            "return_softmax_lse=True",
            "it returns the attention output only, not the softmax log-sum-exp",
            "Call it with return_softmax_lse=False",
            declined,
        )
    for name, value in (
        ("rotary_cos", rotary_cos),
        ("cache_batch_idx", cache_batch_idx),
        ("cache_leftpad", cache_leftpad),
    ):
        if value is not None:
            _refuse(
                function,
                f"{name}=...",
                f"it does not apply {name}",
                f"Apply it before the call and pass {name}=None",
                declined,
            )
    batch, cache_len = k_cache.shape[0], k_cache.shape[1]
    if cache_seqlens is None:
        if k is not None:
            raise AttentionInputError(f"{function}: pass cache_seqlens to say where k and v go in the caches")
        lengths = torch.full((batch,), cache_len, device=q.device)
    elif isinstance(cache_seqlens, Tensor):
        lengths = cache_seqlens.to(device=q.device, dtype=torch.long).expand(batch)
    else:
        lengths = torch.full((batch,), int(cache_seqlens), device=q.device)
    if k is not None and v is not None:
        rows = torch.arange(batch, device=q.device)[:, None]
        positions = lengths[:, None] + torch.arange(k.shape[1], device=q.device)[None, :]
        k_cache[rows, positions] = k.to(k_cache.dtype)
        v_cache[rows, positions] = v.to(v_cache.dtype)
        lengths = lengths + k.shape[1]
    left, right = window_bounds(causal, window_size, cache_len)  # flash-attn's mha_fwd_kvcache: the cache's length
    keep = key_length_keep(q.shape[1], lengths, cache_len, left, right)
    return attend_bshd(q, k_cache, v_cache, keep, scale=softmax_scale)


def _wrapped_flash_attn_forward(*args, **kwargs):
    """flash-attn's internal forward (used by diffusers' context-parallel attention); present so that importing it
    works, refused when called: it must return the softmax log-sum-exp, which npu_port.attention does not give."""
    _refuse(
        "_wrapped_flash_attn_forward",
        "...",
        "it needs the softmax log-sum-exp, which npu-port's attention does not return",
        "Use flash_attn_func, or run without context parallelism",
    )


def _wrapped_flash_attn_backward(*args, **kwargs):
    """flash-attn's internal backward; refused like :func:`_wrapped_flash_attn_forward` (autograd through
    ``flash_attn_func`` works)."""
    _refuse(
        "_wrapped_flash_attn_backward",
        "...",
        "it needs the forward's softmax log-sum-exp, which npu-port's attention does not return",
        "Let autograd differentiate flash_attn_func, or run without context parallelism",
    )
