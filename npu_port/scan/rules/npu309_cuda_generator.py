"""NPU309: ``torch.Generator("cuda")``."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import GENERATOR, argument, live_cuda_literal


@register_rule
class CudaGenerator(Rule):
    """``torch.Generator("cuda")`` / ``torch.Generator(device="cuda")`` (diffusers pipelines' seeded generators).

    Without CUDA it raises "Cannot get CUDA generator without ATen_cuda library". ``npu-port run``'s redirect
    makes the generator on the target; ``npu-port fix`` writes ``torch.Generator(npu_port.get_device())``. Note
    that a generator on another device draws a different random stream than CUDA's for the same seed.

    Example::

        g = torch.Generator("cuda").manual_seed(0)  # NPU309
    """

    code = "NPU309"
    name = "cuda-generator"
    message = '`torch.Generator("cuda")` raises without CUDA'
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"  # a safe rewrite exists in principle; npu-port fix does not do it yet
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            if qualified in GENERATOR and live_cuda_literal(source, argument(call, 0, "device")):
                yield source.finding(
                    self,
                    call,
                    '`torch.Generator("cuda")` raises without CUDA: use `torch.Generator(npu_port.get_device())` '
                    "(npu-port run redirects it)",
                )
