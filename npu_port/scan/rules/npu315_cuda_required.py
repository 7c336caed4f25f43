"""NPU315: ``torch.cuda.is_available()`` whose answer without CUDA stops the program (``device_count()``: NPU316)."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import cuda_calls, cuda_requirement, guarded_finding


@register_rule
class CudaRequired(Rule):
    """``assert torch.cuda.is_available()`` and ``if not torch.cuda.is_available(): raise ...`` (or ``sys.exit``).

    Without CUDA these do not pick another path, they stop the program (an AssertionError, the project's own error).
    ``npu-port run`` answers ``is_available()`` honestly (False) unless it runs with ``--cuda-available``; without
    npu-port, check ``npu_port.get_device()`` instead. A test that only picks a path is NPU306; a device count that
    stops the program is NPU316 (``npu-port run`` answers that one).

    Example::

        assert torch.cuda.is_available(), "Training currently requires at least one GPU."  # NPU315
    """

    code = "NPU315"
    name = "cuda-required"
    message = "`torch.cuda.is_available()` stops the program without CUDA"
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.is_available, from torch.cuda import ...

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            if name == "is_available":
                why = cuda_requirement(source, call)
                if why is not None:
                    yield guarded_finding(source, self, call, why)
