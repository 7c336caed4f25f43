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

The positions come from ``isnan`` reductions over the inputs (no host synchronisation), so a kernel whose backend
hides a NaN still returns it, and one that spreads it no further than the formula does is left as it was.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .call import AttentionCall


def rows_with_keys(call: AttentionCall) -> Optional[Tensor]:
    """``(B|1, H|1, Sq, 1)`` bool: which query rows have at least one key; None when every row has one (no mask:
    top-left causal attention always lets row ``i`` see key 0)."""
    keep = call.keep_mask() if call.mask is not None else None
    return None if keep is None else keep.any(dim=-1, keepdim=True)


def finish_output(out: Tensor, call: AttentionCall) -> Tensor:
    """``out`` (``(B, Hq, Sq, Dv)``, from any kernel) with NaN where the inputs put one and zeros in rows with no
    key (see the module docstring)."""
    bias = call.mask.bias if call.mask is not None else None
    return _finish(out, call.query, call.key, call.value, bias, rows_with_keys(call))


def finish_unmasked(out: Tensor, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """:func:`finish_output` for an unmasked 4-D call, from the tensors alone (the router's prepared fast path)."""
    return _finish(out, query, key, value, None, None)


def _finish(
    out: Tensor, query: Tensor, key: Tensor, value: Tensor, bias: Optional[Tensor], rows: Optional[Tensor]
) -> Tensor:
    nan = float("nan")
    query_rows = torch.isnan(query).any(dim=-1, keepdim=True)  # (B, Hq, Sq, 1)
    if bias is not None:
        query_rows = query_rows | torch.isnan(bias).any(dim=-1, keepdim=True)
    key_heads = torch.isnan(key).flatten(2).any(dim=-1, keepdim=True)  # (B, Hkv, 1)
    value_columns = torch.isnan(value).any(dim=-2) | key_heads  # (B, Hkv, Dv)
    group = query.shape[1] // key.shape[1]
    if group > 1:  # query heads j*G .. j*G+G-1 share key/value head j
        value_columns = value_columns.repeat_interleave(group, dim=1)
    # One copy (the kernel's output may alias something, or be kept by autograd), then in place on that copy:
    # masked_fill's backward needs only the masks, so autograd is unaffected.
    out = out.masked_fill(query_rows, nan).masked_fill_(value_columns.unsqueeze(2), nan)
    return out if rows is None else out.masked_fill_(~rows, 0.0)
