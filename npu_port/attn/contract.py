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

The positions come from NaN-propagating reductions over the inputs (``amax``, then ``isnan`` on the small result), so
a kernel whose backend hides a NaN still returns it, and one that spreads it no further than the formula does is left
as it was. On accelerators this is branch-free (no host synchronisation); on the CPU, where asking is free, an output
whose inputs hold no NaN is returned untouched.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .call import AttentionCall

#: Devices where reading a flag back costs no device synchronisation: there, inputs without NaN skip the work.
CHECK_FIRST_ON = ("cpu",)


def rows_with_keys(call: AttentionCall) -> Optional[Tensor]:
    """``(B|1, H|1, Sq, 1)`` bool: which query rows have at least one key; None when every row has one (no mask:
    top-left causal attention always lets row ``i`` see key 0)."""
    keep = call.keep_mask() if call.mask is not None else None
    return None if keep is None else keep.any(dim=-1, keepdim=True)


def finish_output(out: Tensor, call: AttentionCall) -> Tensor:
    """``out`` (``(B, Hq, Sq, Dv)``, from any kernel) with NaN where the inputs put one and zeros in rows with no
    key (see the module docstring)."""
    bias = call.mask.bias if call.mask is not None else None
    return _finish(out, call.query, call.key, call.value, bias, lambda: rows_with_keys(call))


def finish_unmasked(out: Tensor, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """:func:`finish_output` for an unmasked 4-D call, from the tensors alone (the router's prepared fast path)."""
    return _finish(out, query, key, value, None, lambda: None)


def _finish(
    out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bias: Optional[Tensor],
    rows_with_key: Callable[[], Optional[Tensor]],
) -> Tensor:
    # amax propagates NaN and, unlike a sum, cannot overflow into inf - inf: one read of each input, no big temporary
    if out.device.type in CHECK_FIRST_ON:  # skip everything when no NaN came in
        total = query.amax() + key.amax() + value.amax()  # NaN (or inf - inf: then the exact check below decides)
        if bias is not None:
            total = total + bias.amax()
        if not bool(torch.isnan(total)):
            return out
    query_rows = torch.isnan(query.amax(dim=-1, keepdim=True))  # (B, Hq, Sq, 1)
    if bias is not None:
        query_rows = query_rows | torch.isnan(bias.amax(dim=-1, keepdim=True))
    key_heads = torch.isnan(key.amax(dim=(-2, -1)))  # (B, Hkv)
    value_columns = torch.isnan(value.amax(dim=-2)) | key_heads.unsqueeze(-1)  # (B, Hkv, Dv)
    group = query.shape[1] // key.shape[1]
    if group > 1:  # query heads j*G .. j*G+G-1 share key/value head j
        value_columns = value_columns.repeat_interleave(group, dim=1)
    nan = float("nan")
    # One copy (the kernel's output may alias something, or be kept by autograd), then in place on that copy:
    # masked_fill's backward needs only the masks, so autograd is unaffected.
    out = out.masked_fill(query_rows, nan).masked_fill_(value_columns.unsqueeze(2), nan)
    rows = rows_with_key()
    return out if rows is None else out.masked_fill_(~rows, 0.0)
