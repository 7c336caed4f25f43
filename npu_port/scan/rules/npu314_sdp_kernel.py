"""NPU314: the deprecated ``torch.backends.cuda.sdp_kernel``."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule


@register_rule
class SdpKernel(Rule):
    """``torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=...)``: deprecated
    (a FutureWarning) and about CUDA's attention kernels only.

    Its flags select CUDA backends; on other devices they select nothing useful and a later torch removes the
    function. ``npu-port run`` turns it into ``torch.nn.attention.sdpa_kernel``; ``npu-port fix`` writes
    ``sdpa_kernel([SDPBackend.FLASH_ATTENTION, ...])`` with the backends the flags enabled (the same on CUDA).

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

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            if qualified == "torch.backends.cuda.sdp_kernel":
                yield source.finding(
                    self,
                    call,
                    "`torch.backends.cuda.sdp_kernel` is deprecated and CUDA-only: use "
                    "`torch.nn.attention.sdpa_kernel([SDPBackend...])` (npu-port run converts it)",
                )
