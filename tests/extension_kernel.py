"""A kernel written the way a third party (or a new built-in) adds one: this one module and nothing else.

It declares everything the registry derives its lists from: a priority between sdpa (30) and chunked (20), that the
default selection tries it, no listing place (so it is listed after the built-ins), and that the strategy option
``memory_budget`` sets its ``budget`` option. It computes attention in float64 (exact, slow), so a test can check its
output against a float64 reference. It is not registered on import: tests/attn/test_kernel_extension.py registers it and
takes it out again.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from npu_port.attn.call import AttentionCall
from npu_port.attn.kernels.base import FromStrategy, Kernel, Option, check_positive_int_or_none
from npu_port.reasons import Reason


class Float64Kernel(Kernel):
    """Attention computed in float64 with a plain softmax; refuses calls whose scores exceed ``budget`` bytes."""

    name = "test_float64"
    summary = "float64 softmax attention (test extension kernel)"
    priority = 25
    default_selection = True
    supports_dropout = False
    STRATEGY_OPTIONS = {"budget": FromStrategy("memory_budget")}
    OPTIONS = {"budget": Option(None, check_positive_int_or_none("budget"), "bytes of float64 scores allowed")}

    def call_reasons(self, call: AttentionCall) -> List[Reason]:
        needed = self.score_bytes(call)
        budget = self.options["budget"]
        if budget is not None and needed > budget:
            return [Reason("budget", f"needs {needed} bytes of scores, over the budget of {budget}")]
        return []

    def score_bytes(self, call: AttentionCall) -> int:
        return call.batch * call.heads * call.q_len * call.key_len * 8

    def run(self, call: AttentionCall) -> Tensor:
        query, key, value = (t.double() for t in (call.query, call.key, call.value))
        group = call.heads // call.kv_heads
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
        scores = query @ key.transpose(-1, -2) * call.scale
        keep = call.keep_mask()
        if call.mask is not None and call.mask.bias is not None:
            scores = scores + call.mask.bias.double()
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key: zeros, never NaN
        return (probs @ value).to(call.value.dtype)
