"""NPU315: ``torch.cuda.is_available()`` / ``device_count()`` whose answer without CUDA stops the program."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import AVAILABILITY, cuda_requirement, live_cuda_calls


@register_rule
class CudaRequired(Rule):
    """``assert torch.cuda.is_available()``, ``if not torch.cuda.is_available(): raise ...`` (or ``sys.exit``), and
    ``torch.cuda.device_count()`` used as a divisor (``rank % torch.cuda.device_count()``, also through a name
    assigned it once) or as a ``min`` bound (``tp_size = min(tp_size, torch.cuda.device_count())``).

    Without CUDA these do not pick another path, they stop the program: an AssertionError, the project's own error,
    a ZeroDivisionError, a size of 0. ``npu-port run`` answers ``device_count()`` with the target's count, and
    ``is_available()`` with True only under ``--cuda-available``; without it, ask ``npu_port.get_device()`` and
    ``npu_port.device.device_count()``. A test that only picks a path is NPU306.

    Example::

        assert torch.cuda.is_available(), "Training currently requires at least one GPU."  # NPU315
        device = rank % torch.cuda.device_count()                                          # NPU315
    """

    code = "NPU315"
    name = "cuda-required"
    message = "`torch.cuda.is_available()` / `device_count()` stops the program without CUDA"
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.is_available, from torch.cuda import ...

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in live_cuda_calls(source):
            if name in AVAILABILITY:
                why = cuda_requirement(source, call)
                if why is not None:
                    yield source.finding(self, call, why)
