"""NPU111: a flash_attn call with an argument the drop-in cannot compute faithfully."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._attention_calls import FLASH_UNSUPPORTED, argument, flash_calls, is_constant

_WHAT = {
    "alibi_slopes": "ALiBi slopes (add them as a float attn_mask bias to npu_port.attention instead)",
    "softcap": "logit soft-capping (write the attention out, tanh-capping the scores, where it matters)",
    "return_attn_probs": "returning the probabilities / log-sum-exp (npu_port.attention can return the LSE: use it)",
    "return_softmax_lse": "returning the log-sum-exp (npu_port.attention can return it: call it directly)",
    "block_table": "a paged KV cache (keep the cache contiguous on the target)",
    "rotary_cos": "rotary embedding inside the KV-cache call (apply the rotary embedding before the call)",
}


@register_rule
class FlashAttnUnsupported(Rule):
    """A flash_attn call with ``alibi_slopes``, ``softcap``, ``return_attn_probs=True`` / ``return_softmax_lse``,
    a paged ``block_table`` or rotary embeddings inside ``flash_attn_with_kvcache``.

    npu-port's flash_attn drop-in refuses these (DropInError) rather than compute something else, so the call raises
    under ``npu-port run`` on a CPU or a GPU, and on an NPU unless flash-attn-npu is installed there (Ascend 910B /
    910C): the drop-in then hands the call to ``flash_attn_npu``, which has all of them but rotary embeddings (see
    :mod:`npu_port.dropins.flash_attn_npu`). The message says what to do for each argument.

    Example::

        out = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)  # NPU111
    """

    code = "NPU111"
    name = "flash-attn-unsupported-argument"
    message = "flash_attn call with an argument npu-port's drop-in refuses: raises under npu-port run"
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("alibi_slopes", "softcap", "return_attn_probs", "return_softmax_lse", "block_table", "rotary_cos")

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, function in flash_calls(source):
            bad = [k for k, v in FLASH_UNSUPPORTED.items() if not is_constant(argument(call, k), v)]
            if bad:
                needs = "; ".join(f"{k}: {_WHAT[k]}" for k in bad)
                npu = "" if "rotary_cos" in bad else " unless flash-attn-npu runs it (Ascend 910B / 910C)"
                yield source.finding(
                    self,
                    call,
                    f"`{function}` with {', '.join(bad)}: the drop-in refuses it (DropInError){npu}. {needs}",
                )
