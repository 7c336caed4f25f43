"""NPU304: ``torch.cuda`` calls that raise without CUDA and that ``npu-port run``'s redirect answers."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import HELPERS, RAISES, REDIRECTED, call_text, classify, live_cuda_calls

#: Reported by rules of their own.
ELSEWHERE = frozenset(("set_device",)) | frozenset(HELPERS)


@register_rule
class CudaApiRedirected(Rule):
    """A ``torch.cuda`` call that raises on a machine without CUDA — ``current_device()``, ``get_device_name()``,
    ``get_device_properties()``, ``Event()``, ``Stream()``, ``current_stream()``, ``torch.cuda.device(i)``,
    ``nvtx.range_push()``, ``get_rng_state()``, ``torch.cuda.FloatTensor`` ... — that ``npu-port run``'s CUDA
    redirect answers for the target (events time with the host clock, properties describe the target).

    Outside ``npu-port run`` the line raises (an AssertionError "Torch not compiled with CUDA enabled" or a
    RuntimeError); to drop the dependency on the redirect, ask the target device instead (``npu_port.get_device()``,
    ``torch.npu`` on Ascend).

    Example::

        start = torch.cuda.Event(enable_timing=True)  # NPU304
        name = torch.cuda.get_device_name()            # NPU304
    """

    code = "NPU304"
    name = "cuda-api-redirected"
    message = "`torch.cuda` call raises without CUDA; npu-port run answers it"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in live_cuda_calls(source):
            if classify(name) == RAISES and name in REDIRECTED and name not in ELSEWHERE:
                yield source.finding(
                    self,
                    call,
                    f"{call_text(name)} raises without CUDA; npu-port run answers it for the target, "
                    "elsewhere ask npu_port.get_device()",
                )
