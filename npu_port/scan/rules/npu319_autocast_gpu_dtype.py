"""NPU319: ``torch.get_autocast_gpu_dtype()``, deprecated, and CUDA's autocast dtype rather than the device's."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule

#: The deprecated per-device autocast queries and setters (torch 2.4) and the device they speak for.
GPU_AUTOCAST = {
    "torch.get_autocast_gpu_dtype": "get_autocast_dtype",
    "torch.set_autocast_gpu_dtype": "set_autocast_dtype",
    "torch.is_autocast_gpu_enabled": "is_autocast_enabled",
    "torch.set_autocast_gpu_enabled": "set_autocast_enabled",
}


@register_rule
class AutocastGpuDtype(Rule):
    """``torch.get_autocast_gpu_dtype()`` (and ``set_autocast_gpu_dtype``, ``is_autocast_gpu_enabled``,
    ``set_autocast_gpu_enabled``): deprecated since torch 2.4, and they speak of CUDA's autocast.

    Code that saves the autocast state to replay it later (a checkpointed forward, a custom autograd function) reads
    CUDA's dtype even when the autocast that is on is the NPU's: the replay then runs in another dtype. Ask for the
    device's: ``torch.get_autocast_dtype(device_type)``.

    Example::

        dtype = torch.get_autocast_gpu_dtype()  # NPU319 -> torch.get_autocast_dtype(x.device.type)
    """

    code = "NPU319"
    name = "autocast-gpu-dtype"
    message = "`torch.get_autocast_gpu_dtype()` is deprecated and answers CUDA's autocast"
    severity = "deprecated"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("autocast_gpu",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            replacement = GPU_AUTOCAST.get(qualified or "")
            if replacement is not None:
                yield source.finding(
                    self,
                    call,
                    f"`{qualified}()` is deprecated and speaks of CUDA's autocast, not the NPU's: use "
                    f"`torch.{replacement}(device_type, ...)`",
                )
