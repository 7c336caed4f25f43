"""NPU410: float64 or complex tensors in RoPE code, which the NPU's kernels do not compute."""

from __future__ import annotations

import re
from typing import Dict, Iterator, List, Tuple

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._rope import ROPE_WORDS, rope_scope, rope_scopes, wide_dtypes

_WHY = {
    "complex": "the NPU has no complex kernels for most ops (aclnn raises 'not implemented for DT_COMPLEX64', or the "
    "op falls back to the AI CPU)",
    "float64": "the NPU's AI Core has no float64 (aclnn raises 'not implemented for DT_DOUBLE', or the op falls back "
    "to the slow AI CPU)",
}
_DO = {
    "complex": "rotate with real float32 cos / sin instead (`x * cos + rotate_half(x) * sin`, as diffusers' "
    "`get_1d_rotary_pos_embed(..., use_real=True)` returns them; torch_npu.npu_rotary_mul takes that form)",
    "float64": "build the table in float32 (diffusers passes `freqs_dtype=torch.float32` on NPU), or in float64 on the "
    "CPU and `.float()` it before it moves to the NPU",
}


@register_rule
class RopeFloat64Complex(Rule):
    """float64 or complex tensors in rotary-position-embedding code: ``torch.view_as_complex``, ``torch.polar``,
    ``torch.complex``, ``dtype=torch.float64`` / ``torch.double`` / ``torch.complex64`` (any use of these dtypes:
    ``.to(torch.float64)``, ``.type(torch.complex64)``), ``.double()`` / ``.cfloat()`` — inside a function or class
    whose name says RoPE (``rope``, ``rotary`` or ``freqs`` as a word: ``rope_params``, ``apply_rotary_emb``,
    ``precompute_freqs_cis``, ``WanRotaryPosEmbed``). The same calls elsewhere (an FFT, a loss) are not reported,
    nor ``torch.float32 if is_npu else torch.float64`` (the code already picks per device).

    On an Ascend NPU these tables are where ports break: the AI Core kernels compute neither float64 nor complex
    numbers, so depending on the op and the CANN version the call raises (diffusers#10428: Flux's float64 RoPE,
    "aclnnRepeatInterleaveIntWithDim ... not implemented for DT_DOUBLE"; diffusers#12979: Z-Image's complex64 RoPE
    and ``aclnnIndex``) or runs on the AI CPU, far slower (DiffSynth-Studio#1191: Wan's complex128 RoPE). CPUs and
    GPUs compute both, so the rule concerns the NPU only, and ``npu-port run`` changes nothing here. The fix is the
    real form: cos / sin tables in float32 and ``x * cos + rotate_half(x) * sin`` (diffusers'
    ``get_1d_rotary_pos_embed(..., use_real=True)``, ``apply_rotary_emb(..., use_real=True)``); where float64 matters
    for long positions, compute the table on the CPU and cast it to float32 before it moves to the device.

    Example::

        def rope_params(max_seq_len, dim, theta=10000):
            freqs = torch.outer(torch.arange(max_seq_len), 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(
                torch.float64).div(dim)))                      # NPU410
            return torch.polar(torch.ones_like(freqs), freqs)  # NPU410
    """

    code = "NPU410"
    name = "rope-float64-complex"
    message = "float64 / complex tensors in RoPE code: the NPU's kernels do not compute them"
    severity = "runtime"
    targets = ("npu",)
    fix = "manual"
    #: Narrow on purpose ("double" and "complex" are common words): every form the rule reports contains one.
    triggers = (
        "float64", "torch.double", ".double(", "view_as_complex", "polar", "complex(", "complex32", "complex64",
        "complex128", "cfloat", "cdouble", "chalf",
    )  # fmt: skip
    #: ... and only in RoPE code: a file without a rope / rotary / freqs name has none (float64 is everywhere else).
    also_triggers = (re.compile("|".join(ROPE_WORDS), re.IGNORECASE),)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        if not rope_scopes(source):
            return
        lines: Dict[int, List[Tuple[object, str, str, str]]] = {}  # one finding a line, naming all it holds
        for node, kind, shown in wide_dtypes(source):
            scope = rope_scope(source, node)
            if scope is not None:
                lines.setdefault(node.lineno, []).append((node, kind, shown, scope))  # type: ignore[attr-defined]
        for found in lines.values():
            found.sort(key=lambda item: item[0].col_offset)  # type: ignore[attr-defined]
            node, _, _, scope = found[0]
            kinds = list(dict.fromkeys(kind for _, kind, _, _ in found))
            shown = ", ".join(dict.fromkeys(f"`{s}`" for _, _, s, _ in found))
            yield source.finding(
                self,
                node,  # type: ignore[arg-type]
                f"{' and '.join(kinds)} ({shown}) in RoPE code (`{scope}`): "
                + "; ".join(f"{_WHY[kind]}: {_DO[kind]}" for kind in kinds),
            )
