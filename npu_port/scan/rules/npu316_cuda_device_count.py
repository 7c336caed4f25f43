"""NPU316: ``torch.cuda.device_count()`` whose answer without CUDA (0) stops the program."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import cuda_calls, cuda_requirement, guarded_finding


@register_rule
class CudaDeviceCount(Rule):
    """``torch.cuda.device_count()`` used as a divisor (``rank % torch.cuda.device_count()``, also through a name
    assigned it once), as a ``min`` bound (``tp_size = min(tp_size, torch.cuda.device_count())``), asserted on, or
    the test of an ``if`` that raises or exits without CUDA.

    Without CUDA it answers 0, and these stop the program: a ZeroDivisionError, a size of 0, an AssertionError.
    ``npu-port run`` answers it with the target's device count (the NPUs of the machine; 1 on a CPU), so the code
    runs as it is there; without npu-port, use ``npu_port.device.device_count()``. A count that only picks a path
    is NPU306.

    Example::

        device = rank % torch.cuda.device_count()          # NPU316
        assert torch.cuda.device_count() > 0               # NPU316
    """

    code = "NPU316"
    name = "cuda-device-count"
    message = "`torch.cuda.device_count()` is 0 without CUDA and stops the program here"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("device_count",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            if name == "device_count":
                why = cuda_requirement(source, call)
                if why is not None:
                    yield guarded_finding(source, self, call, why)
