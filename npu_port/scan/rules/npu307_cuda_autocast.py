"""NPU307: autocast for CUDA: ``torch.cuda.amp.autocast``, ``torch.autocast("cuda")``."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import AUTOCAST, argument, cuda_guarded, live_cuda_literal


@register_rule
class CudaAutocast(Rule):
    """Mixed precision asked of CUDA: ``torch.cuda.amp.autocast(...)`` (however imported or aliased),
    ``torch.autocast("cuda")``, ``torch.autocast(device_type="cuda")``, ``torch.amp.autocast("cuda")``.

    Without CUDA, torch warns "CUDA is not available ... Disabling autocast" and the block runs in float32: slower
    and twice the memory on an NPU, and code that expects half-precision outputs may break. ``npu-port run``'s
    redirect makes it the target's autocast (keeping CUDA's float16 default); ``npu-port fix`` writes
    ``torch.autocast(npu_port.device.autocast_device_type(), ...)``, which is ``"cuda"`` on CUDA.

    Example::

        with torch.cuda.amp.autocast(dtype=torch.float16):  # NPU307
            y = model(x)
        with torch.autocast(device_type="cuda"):  # NPU307
            y = model(x)
    """

    code = "NPU307"
    name = "cuda-autocast"
    message = "autocast for CUDA is disabled (with a warning) elsewhere"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"  # a safe rewrite exists in principle; npu-port fix does not do it yet
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("autocast",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            if qualified == "torch.cuda.amp.autocast":
                cuda = not cuda_guarded(source, call)
            else:
                cuda = qualified in AUTOCAST and live_cuda_literal(source, argument(call, 0, "device_type"))
            if cuda:
                yield source.finding(
                    self,
                    call,
                    "autocast for CUDA warns and runs disabled (float32) elsewhere: use "
                    "`torch.autocast(npu_port.device.autocast_device_type(), ...)` (npu-port run redirects it)",
                )
