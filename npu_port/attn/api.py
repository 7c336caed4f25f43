"""``npu_port.attention``: one call with SDPA's semantics, many kernels behind it."""

from __future__ import annotations

from typing import Optional, Tuple, Union

from torch import Tensor

from .call import AttentionCall
from .contract import finish_lse, finish_output
from .kernels.base import Kernel
from .select import resolve_kernel
from .watch import WATCHERS, inside, observe


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    kernel: Union[None, str, Kernel] = None,
    return_lse: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Scaled dot-product attention with exactly the semantics of ``torch.nn.functional.scaled_dot_product_attention``.

    Layout ``(..., heads, seq_len, head_dim)``; a bool ``attn_mask`` is True where a key takes part, a float one is
    added to the scaled scores, and masks broadcast from the right; ``is_causal`` is top-left aligned and combines
    with a mask; ``enable_gqa`` shares key/value heads across query heads. One addition: a query row whose keys are
    all masked gives zeros, never NaN, on every kernel and in every dtype (an additive value at or below
    ``npu_port.masks.MASKED_AT_OR_BELOW`` counts as masked, like ``-inf``). A NaN in the inputs comes out where SDPA's
    documented math formula puts it, on every kernel (see :mod:`npu_port.attn.contract`).

    ``kernel``: a kernel name (see :func:`npu_port.kernels`), a configured kernel (``get_kernel("chunked",
    max_bytes=...)``), or None for the active choice. A named kernel that cannot run the call raises
    :class:`~npu_port.errors.KernelUnavailableError` with its reasons and the kernels that can; it never falls
    back silently.

    ``return_lse=True`` returns ``(out, lse)``: ``lse`` is float32 of shape ``(..., heads, q_len)``, the natural log
    of the sum over keys of ``exp(scale * q.k + float mask)`` — what ring attention needs to merge partial results
    (``out = sum_i exp(lse_i - lse) * out_i``). A row whose keys are all masked has ``lse = -inf`` (and zeros out).
    Only kernels that can return it are chosen; a named one that cannot raises with the reason (code ``lse``).
    """
    if WATCHERS and not inside():  # npu_port.diff is recording this run (attn/watch.py)
        return observe(attention, query, key, value, attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                       enable_gqa=enable_gqa, kernel=kernel, return_lse=return_lse)  # fmt: skip
    call = AttentionCall.from_arguments(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse
    )
    if return_lse:
        return run_call_lse(call, resolve_kernel(kernel, call))
    return run_call(call, resolve_kernel(kernel, call))


def run_call(call: AttentionCall, chosen: Kernel) -> Tensor:
    """Run a validated call on the kernel chosen for it, in the caller's layout (empty calls never reach a kernel)."""
    if call.is_empty:
        return call.empty_output()
    return call.restore_shape(run_kernel(call, chosen))


def run_kernel(call: AttentionCall, chosen: Kernel) -> Tensor:
    """``chosen.run(call)`` held to the output contract (NaN in, NaN out; rows with no key give zeros), 4-D."""
    return finish_output(chosen.run(call), call)


def run_call_lse(call: AttentionCall, chosen: Kernel) -> Tuple[Tensor, Tensor]:
    """:func:`run_call` with the log-sum-exp: ``(out, lse)`` in the caller's layout, both held to the contract."""
    if call.query.numel() == 0 or call.key_len == 0:
        return call.empty_output(), call.empty_lse()
    out, lse = chosen.run_lse(call)
    return call.restore_shape(finish_output(out, call)), call.restore_lse_shape(finish_lse(lse, call))
