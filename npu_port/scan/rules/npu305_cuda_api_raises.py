"""NPU305: ``torch.cuda`` calls that raise without CUDA and that nothing in npu-port answers."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import RAISES, REDIRECTED, call_text, classify, cuda_branch_note, cuda_calls


@register_rule
class CudaApiRaises(Rule):
    """A ``torch.cuda`` call that raises without CUDA and that ``npu-port run`` does not answer either: CUDA graphs
    (``CUDAGraph()``, ``torch.cuda.graph``), the nvml queries (``utilization()``, ``temperature()``), the allocator's
    internals (``memory_snapshot()``, ``memory._record_memory_history()``, ``caching_allocator_alloc()``),
    ``set_sync_debug_mode()``, ``can_device_access_peer()``, ``cudart()``.

    Guard the line with the device type (``if npu_port.get_device().type == "cuda":``) or replace it by the
    target's equivalent (``torch.npu.NPUGraph``, ``torch.npu.memory_snapshot`` on Ascend). Under ``if
    torch.cuda.is_available():`` it is still reported: ``npu-port run --cuda-available`` (what NPU306 suggests for
    that test) takes the branch, and then it raises.

    Example::

        g = torch.cuda.CUDAGraph()                # NPU305
        torch.cuda.memory._record_memory_history()  # NPU305
    """

    code = "NPU305"
    name = "cuda-api-raises"
    message = "`torch.cuda` call raises without CUDA and npu-port does not answer it"
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cuda",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in cuda_calls(source):
            if classify(name) == RAISES and name not in REDIRECTED:
                guarded = cuda_branch_note(source, call)
                yield source.finding(
                    self,
                    call,
                    f"{call_text(name)} raises without CUDA and npu-port does not answer it{guarded}: guard it with "
                    "the device type or use the target's equivalent",
                )
