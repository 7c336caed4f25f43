"""NPU112: a call of xformers' ``memory_efficient_attention``, with the arguments that need care."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._attention_calls import (
    XFORMERS_ATTENTION,
    XFORMERS_BIASES,
    XFORMERS_POSITIONS,
    argument,
    is_constant,
    xformers_bias,
    xformers_calls,
    xformers_refused,
)
from ._imports import DROPIN_HANDLER


@register_rule
class XformersCall(Rule):
    """A call of xformers' ``memory_efficient_attention`` (``xformers.ops`` or ``xformers.ops.fmha``, also
    ``memory_efficient_attention_forward``), however imported (``import xformers.ops as xops``, ``from xformers.ops
    import memory_efficient_attention as mea``); a project's own function of that name is not xformers'.

    Under ``npu-port run`` the xformers drop-in computes it through ``npu_port.attention`` with xformers' semantics:
    BMHK / BMK / BMGHK layouts, ``attn_bias`` None, an additive float tensor, or one of the biases it serves —
    ``LowerTriangularMask`` (causal *top-left*: query ``i`` sees keys ``j <= i``, as SDPA's ``is_causal``),
    ``LowerTriangularFromBottomRightMask``, ``LowerTriangularMaskWithTensorBias``,
    ``LocalAttentionFromBottomRightMask``, ``BlockDiagonalMask`` / ``BlockDiagonalCausalMask`` /
    ``BlockDiagonalCausalFromBottomRightMask`` (packed sequences, batch 1). ``p`` is applied as dropout by
    ``npu_port.attention`` (its own random stream); ``op=`` is accepted and ignored (the active attention strategy
    picks the kernel). The message names the bias, the dropout and the op of the call; what the drop-in lacks is
    NPU113.

    Example::

        out = xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())  # NPU112
    """

    code = "NPU112"
    name = "xformers-call"
    message = "xformers attention call: computed by npu_port.attention under the drop-in"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = DROPIN_HANDLER["xformers"]
    triggers = ("xformers",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in xformers_calls(source):
            function = XFORMERS_ATTENTION.get(qualified)
            if function is None or xformers_refused(source, call):
                continue  # another xformers function; or NPU113's
            care = []
            bias_node = argument(call, "attn_bias", XFORMERS_POSITIONS["attn_bias"])
            if bias_node is not None and not is_constant(bias_node, None):
                served = xformers_bias(source, bias_node).served
                care.append(
                    f"attn_bias {served}: {XFORMERS_BIASES.get(served, 'served by the drop-in')}"
                    if served
                    else "attn_bias: an additive float tensor (0 keep, -inf masked) or a bias class the drop-in serves"
                )
            if not is_constant(argument(call, "p", XFORMERS_POSITIONS["p"]), 0.0):  # 0 == 0.0
                care.append("dropout p applied by npu_port.attention (its own random stream)")
            if not is_constant(argument(call, "op"), None):
                care.append("op= ignored (the active attention strategy picks the kernel)")
            detail = "; ".join(care) if care else "no argument that needs care"
            yield source.finding(
                self, call, f"`{function}` runs through npu_port.attention under the xformers drop-in: {detail}"
            )
