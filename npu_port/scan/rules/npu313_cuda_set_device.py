"""NPU313: ``torch.cuda.set_device(local_rank)``."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import cuda_calls, guarded_finding


@register_rule
class CudaSetDevice(Rule):
    """``torch.cuda.set_device(local_rank)``, the first line of most distributed launchers.

    Without CUDA it raises (AttributeError: torch._C has no ``_cuda_setDevice``). ``npu-port run`` forwards it to
    ``torch.npu.set_device`` on Ascend and ignores it on a CPU. Without npu-port, call the target's
    ``set_device`` (``torch.npu.set_device`` on Ascend) — ``torch.get_device_module(device).set_device(i)`` works
    on any accelerator.

    Example::

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # NPU313
    """

    code = "NPU313"
    name = "cuda-set-device"
    message = "`torch.cuda.set_device()` raises without CUDA"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            if name == "set_device":
                yield guarded_finding(
                    source,
                    self,
                    call,
                    "`torch.cuda.set_device()` raises without CUDA: use the target's, "
                    "`torch.get_device_module(npu_port.get_device()).set_device(i)` (npu-port run forwards it)",
                )
