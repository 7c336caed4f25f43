"""NPU314: the deprecated ``torch.backends.cuda.sdp_kernel``."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule


@register_rule
class SdpKernel(Rule):
    """``torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=...)``: deprecated
    (a FutureWarning) and about CUDA's attention kernels only.

    Its flags select CUDA backends; on other devices they select nothing useful and a later torch removes the
    function. ``npu-port run`` turns it into ``torch.nn.attention.sdpa_kernel``; ``npu-port fix`` writes
    ``sdpa_kernel([SDPBackend.FLASH_ATTENTION, ...])`` with the backends the flags enabled (the same on CUDA) where
    the torch beside it is 2.3 or later (``SDPBackend.CUDNN_ATTENTION``, which ``enable_cudnn`` means, came then);
    with an older torch it leaves the call and says why.

    Example::

        with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False):  # NPU314
            out = F.scaled_dot_product_attention(q, k, v)
    """

    code = "NPU314"
    name = "sdp-kernel"
    message = "`torch.backends.cuda.sdp_kernel` is deprecated and CUDA-only"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("sdp_kernel",)
    fix_imports = ("torch.nn.attention",)
    fix_replaces = ("torch.backends.cuda.sdp_kernel",)
    fix_needs_torch = "2.3"  # sdpa_kernel came in 2.2, SDPBackend.CUDNN_ATTENTION (sdp_kernel's enable_cudnn) in 2.3

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for node in source.of(ast.ImportFrom):  # `from torch.backends.cuda import sdp_kernel`: on its first line
            if node.module == "torch.backends.cuda" and any(a.name == "sdp_kernel" for a in node.names):  # type: ignore[attr-defined]
                yield source.finding(
                    self,
                    node,
                    "`torch.backends.cuda.sdp_kernel` is deprecated and CUDA-only: import "
                    "`torch.nn.attention.sdpa_kernel` instead",
                    fix="manual",
                )
        for call, qualified in source.calls():
            if qualified == "torch.backends.cuda.sdp_kernel":
                literal = (
                    not call.keywords
                    and not call.args
                    or all(
                        isinstance(a.value if isinstance(a, ast.keyword) else a, ast.Constant)
                        and isinstance((a.value if isinstance(a, ast.keyword) else a).value, bool)
                        for a in [*call.args, *call.keywords]
                    )
                )
                yield source.finding(
                    self,
                    call,
                    "`torch.backends.cuda.sdp_kernel` is deprecated and CUDA-only: use "
                    "`torch.nn.attention.sdpa_kernel([SDPBackend...])` (npu-port run converts it)",
                    fix=None if literal and all(k.arg in FLAGS for k in call.keywords) else "manual",
                )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``sdp_kernel(enable_flash=True, enable_math=False, ...)`` -> ``torch.nn.attention.sdpa_kernel([...])``
        with the backends whose flags are true (each flag defaults to True, as in ``sdp_kernel``); only when every
        flag is a literal True / False, and no comment sits among the flags (the new call has no place for it: the
        finding is left for a hand, the comment kept)."""
        import libcst as cst
        import libcst.matchers as m

        if not isinstance(node, cst.Call) or m.findall(node, m.Comment()):
            return None
        flags = dict(zip(FLAGS, [True] * len(FLAGS)))
        for index, arg in enumerate(node.args):
            name = arg.keyword.value if arg.keyword is not None else (FLAGS[index] if index < len(FLAGS) else None)
            if name not in flags or not isinstance(arg.value, cst.Name) or arg.value.value not in ("True", "False"):
                return None
            flags[name] = arg.value.value == "True"
        chosen = [f"torch.nn.attention.SDPBackend.{BACKENDS[name]}" for name in FLAGS if flags[name]]
        return cst.parse_expression(f"torch.nn.attention.sdpa_kernel([{', '.join(chosen)}])")


#: ``sdp_kernel``'s flags in its positional order, and the ``SDPBackend`` each enables.
FLAGS = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")
BACKENDS = {
    "enable_flash": "FLASH_ATTENTION",
    "enable_math": "MATH",
    "enable_mem_efficient": "EFFICIENT_ATTENTION",
    "enable_cudnn": "CUDNN_ATTENTION",
}
