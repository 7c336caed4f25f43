"""The two output rules every kernel's result is held to, whatever backend computed it: NaN in, NaN out; and a
query row with no key gives zeros.

Backends disagree about NaN. torch's CPU flash-attention kernel takes a row whose scores are not finite for an empty
row and writes zeros (an unmasked query row with a NaN came out as 0 under ``sdpa`` on torch 2.13), while its math
backend gives NaN; flash kernels skip key blocks a causal mask hides, so a NaN there reaches some rows and not
others; ``math`` and ``chunked`` fill masked scores instead of adding ``-inf``, which drops a NaN key that the row
may not see. A NaN that disappears is a wrong answer that looks right, so the pattern is fixed here, once, for every
kernel: it is the pattern of SDPA's documented math formula (``softmax(q @ k^T * scale + mask) @ v``, masked
positions added as ``-inf``):

- a NaN in query row ``i`` makes output row ``i`` NaN;
- a NaN anywhere in a key makes every row of the heads that share that key/value head NaN (``NaN + -inf`` is NaN,
  masked or not);
- a NaN in value column ``d`` makes column ``d`` of every row of those heads NaN (``0 * NaN`` is NaN);
- a NaN in an additive float mask makes its query row NaN;
- except that a row whose keys are all masked gives zeros, NaN or not (npu-port's one addition to SDPA).

With ``return_lse=True`` the log-sum-exp (float32, ``(..., heads, q_len)``: ``log(sum_j exp(scale * q.k_j + mask))``
over the keys the row sees) follows the same formula: NaN where a NaN in the query row, in a key of its head, or in
its float mask row reaches the scores (value NaN does not: the lse never reads the values), and ``-inf`` in a row
whose keys are all masked — so that merging blocks with ``exp(lse_i - lse)`` gives such a block weight zero.

The positions come from NaN-propagating reductions over the inputs (``amax``, then ``isnan`` on the small result), so
a kernel whose backend hides a NaN still returns it, and one that spreads it no further than the formula does is left
as it was. On accelerators this is branch-free (no host synchronisation); on the CPU, where asking is free, an output
whose inputs hold no NaN is returned untouched.

Under autograd the contract must add nothing a recompute could see differently. Gradient checkpointing runs a call
twice, the forward and its recompute in the backward, and torch's checkpoint compares the tensors each run saved for
backward. So every check reads detached tensors (no autograd node, nothing saved: the checks are not part of the
result), and the only ops the contract adds to the graph, the NaN fills, are added on the CPU exactly when an input
holds a NaN the formula passes on — a fact of the inputs alone, the same for the forward and its recompute, and the
same whether the output was screened first (:func:`finish_unmasked`) or the inputs were (:func:`finish_output`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .call import AttentionCall
from .masks import causal_keep

#: Devices where reading a flag back costs no device synchronisation: there, inputs without NaN skip the work.
CHECK_FIRST_ON = ("cpu",)


def _data(tensor: Tensor) -> Tensor:
    """``tensor`` as a check reads it: detached when autograd tracks it, so that a check records no node and saves
    nothing (a check on a tensor that requires grad would otherwise save it, and its result, for a backward that
    never comes — and gradient checkpointing counts what is saved)."""
    return tensor.detach() if tensor.requires_grad else tensor


def _may_hold_nan(*tensors: Optional[Tensor]) -> bool:
    """Whether any input may hold a NaN, read on the host: one reduction and one scalar read per tensor (a sum of
    ``amax`` values is NaN for a NaN anywhere, and for ``inf - inf``, when the exact check below decides). Scalar reads
    cost less than combining the reductions as tensors: this runs on every CPU call, whose work may be ~10 µs."""
    return math.isnan(  # (_data inlined: this runs on every CPU call of the full path)
        sum((t.detach() if t.requires_grad else t).amax().item() for t in tensors if t is not None and t.numel())
    )


def _nan_along(tensor: Tensor, dims: Tuple[int, ...], keepdim: bool = False) -> Tensor:
    """``isnan(tensor.amax(dims))`` (read detached: a mask, never part of a gradient); all False where ``tensor``
    has no elements (``amax`` refuses an empty reduction, and an empty tensor holds no NaN)."""
    if tensor.numel():
        return torch.isnan(_data(tensor).amax(dim=dims, keepdim=keepdim))
    reduced = {d % tensor.dim() for d in dims}
    shape = [1 if i in reduced else size for i, size in enumerate(tensor.shape) if keepdim or i not in reduced]
    return torch.zeros(shape, dtype=torch.bool, device=tensor.device)


def rows_with_keys(call: AttentionCall) -> Optional[Tensor]:
    """``(B|1, H|1, Sq|1, 1)`` bool: which query rows have at least one key; None when every row has one (no mask:
    top-left causal attention always lets row ``i`` see key 0).

    Never the ``(Sq, Skv)`` causal mask for a key-padding mask under ``is_causal`` (``chunked`` exists so that nothing
    that size is built): row ``i`` sees keys ``0..i``, so it has one when the running "any key kept yet" along the
    keys is true at ``min(i, Skv - 1)``."""
    if call.mask is None:
        return None
    keep = call.mask.keep
    if not call.is_causal:
        return keep.any(dim=-1, keepdim=True)
    if keep.shape[-2] == 1:
        seen = keep.cumsum(dim=-1) > 0  # (..., 1, Skv)
        last_key = torch.arange(call.q_len, device=keep.device).clamp_(max=call.key_len - 1)
        return seen[..., 0, last_key].unsqueeze(-1)
    return (keep & causal_keep(call.q_len, call.key_len, keep.device)).any(dim=-1, keepdim=True)


def finish_output(out: Tensor, call: AttentionCall) -> Tensor:
    """``out`` (``(B, Hq, Sq, Dv)``, from any kernel) with NaN where the inputs put one and zeros in rows with no
    key (see the module docstring)."""
    bias = call.mask.bias if call.mask is not None else None
    return _finish(out, call.query, call.key, call.value, bias, lambda: rows_with_keys(call))


def finish_unmasked(
    out: Tensor, query: Tensor, key: Tensor, value: Tensor, *, zeros_hide_nan: bool = False, tracked: bool = False
) -> Tensor:
    """:func:`finish_output` for an unmasked 4-D call, from the tensors alone (the router's prepared fast path).

    ``zeros_hide_nan``: the kernel is one whose backend, where it loses a NaN, writes a row of zeros in its place
    (``Kernel.zeros_hide_nan``: torch's CPU SDPA). Then, on the CPU, the output alone is screened first — one pass
    over one contiguous tensor instead of one over each of three (often strided) inputs: the fast path serves small
    calls whose whole work is ~10 µs, and those screens were a few percent of a tiny pipeline. An output with a NaN,
    or with a row that sums to exactly zero (the hidden-NaN mark, or rarely a real one), goes on to the full check.

    ``tracked``: autograd tracks the call (the router prepares a runner per signature, and the signature says so), so
    the screen reads the output detached; an untracked call's output is read as it is, at no cost to the fast path.
    """
    if zeros_hide_nan and out.device.type in CHECK_FIRST_ON and _output_is_clean(out.detach() if tracked else out):
        return out
    return _finish(out, query, key, value, None, lambda: None)


def _output_is_clean(out: Tensor) -> bool:
    """No NaN and no row summing to exactly zero: ``sum(1 / row_sums)`` is finite (a zero row gives ``inf``, a NaN
    NaN; a row so small that its reciprocal overflows is a false alarm, which only costs the full check). ``out``
    must not be tracked by autograd (the caller detaches it: see :func:`finish_unmasked`)."""
    accumulate = torch.float64 if out.dtype == torch.float64 else torch.float32
    return math.isfinite(out.sum(dim=-1, dtype=accumulate).reciprocal_().sum().item())


def _finish(
    out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bias: Optional[Tensor],
    rows_with_key: Callable[[], Optional[Tensor]],
) -> Tensor:
    # amax propagates NaN and, unlike a sum, cannot overflow into inf - inf: one read of each input, no big temporary
    check_first = out.device.type in CHECK_FIRST_ON
    if out.numel() == 0 or (check_first and not _may_hold_nan(query, key, value, bias)):
        return out
    query_rows = _nan_along(query, (-1,), keepdim=True)  # (B, Hq, Sq, 1)
    if bias is not None:
        query_rows = query_rows | _nan_along(bias, (-1,), keepdim=True)
    key_heads = _nan_along(key, (-2, -1))  # (B, Hkv)
    value_columns = _nan_along(value, (-2,)) | key_heads.unsqueeze(-1)  # (B, Hkv, Dv)
    if check_first and not (bool(query_rows.any()) or bool(value_columns.any())):
        return out  # inf - inf made the quick check ask, and no NaN is there: the graph gets no fill (see above)
    group = query.shape[1] // key.shape[1]
    if group > 1:  # query heads j*G .. j*G+G-1 share key/value head j
        value_columns = value_columns.repeat_interleave(group, dim=1)
    nan = float("nan")
    # One copy (the kernel's output may alias something, or be kept by autograd), then in place on that copy:
    # masked_fill's backward needs only the masks, so autograd is unaffected.
    out = out.masked_fill(query_rows, nan).masked_fill_(value_columns.unsqueeze(2), nan)
    rows = rows_with_key()
    return out if rows is None else out.masked_fill_(~rows, 0.0)


def finish_lse(lse: Tensor, call: AttentionCall) -> Tensor:
    """The ``(B, Hq, Sq)`` float32 log-sum-exp of any kernel held to the contract: NaN where the inputs put one in the
    scores, ``-inf`` in rows with no key (see the module docstring)."""
    lse = lse.float()
    query, key = call.query, call.key
    bias = call.mask.bias if call.mask is not None else None
    check_first = lse.device.type in CHECK_FIRST_ON
    if lse.numel() and not (check_first and not _may_hold_nan(query, key, bias)):
        rows = _nan_along(query, (-1,))  # (B, Hq, Sq)
        if bias is not None:
            rows = rows | _nan_along(bias, (-1,))
        key_heads = _nan_along(key, (-2, -1))  # (B, Hkv)
        if call.group > 1:
            key_heads = key_heads.repeat_interleave(call.group, dim=1)
        nan_rows = rows | key_heads.unsqueeze(-1)
        if not (check_first and not bool(nan_rows.any())):  # as in _finish: a fill only where a NaN is
            lse = lse.masked_fill(nan_rows, float("nan"))
    has_key = rows_with_keys(call)
    return lse if has_key is None else lse.masked_fill(~has_key.squeeze(-1), float("-inf"))
