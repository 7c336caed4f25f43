"""NPU113: an xformers call naming something npu-port's xformers drop-in does not define."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._attention_calls import xformers_calls, xformers_refused


@register_rule
class XformersUnsupported(Rule):
    """An xformers call that needs what the drop-in does not define: an ``attn_bias`` class it does not serve
    (``BlockDiagonalPaddedKeysMask``, ``BlockDiagonalCausalWithOffsetPaddedKeysMask``, the paged and gappy masks, or
    a method such as ``make_local_attention()``), an ``op=`` from a kernel module (``xops.fmha.cutlass.FwOp``,
    ``xops.fmha.flash.FwOp``), or another ``xformers.ops`` function (``memory_efficient_attention_partial``,
    ``merge_attentions``, ``swiglu``, ...).

    Under ``npu-port run`` the lookup raises AttributeError (an unknown bias object reaching the drop-in raises
    DropInError): the drop-in refuses rather than compute something else. Rewrite the call with a bias the drop-in
    serves (NPU112 lists them), pass an additive float tensor, or call ``npu_port.attention`` with a mask. An import
    of such a name is NPU104 as well.

    Example::

        bias = xops.fmha.attn_bias.BlockDiagonalPaddedKeysMask.from_seqlens(q_len, kv_pad, kv_len)
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)  # NPU113
    """

    code = "NPU113"
    name = "xformers-unsupported"
    message = "xformers call needs what npu-port's drop-in does not define: raises under npu-port run"
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("xformers",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in xformers_calls(source):
            missing = xformers_refused(source, call)
            if missing:
                shown = qualified.rsplit(".", 1)[-1]
                yield source.finding(
                    self,
                    call,
                    f"`{shown}` needs {', '.join(f'`{m}`' for m in missing)}, which npu-port's xformers drop-in does "
                    "not define (AttributeError under npu-port run): use a bias it serves (NPU112), an additive "
                    "float tensor, or npu_port.attention",
                )
