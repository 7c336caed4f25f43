"""NPU308: a GradScaler for CUDA: ``torch.cuda.amp.GradScaler``, ``torch.amp.GradScaler("cuda")`` or with no device."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import GRAD_SCALER, argument, cuda_guarded, live_cuda_literal


@register_rule
class CudaGradScaler(Rule):
    """A gradient scaler for CUDA: ``torch.cuda.amp.GradScaler()``, ``torch.amp.GradScaler("cuda")`` and
    ``torch.amp.GradScaler()`` with no device (which means CUDA).

    Without CUDA torch warns "GradScaler is enabled, but CUDA is not available. Disabling." and scaling is off: float16
    training on an NPU then underflows its gradients. ``npu-port run``'s redirect gives the scaler the target's
    device; ``npu-port fix`` writes ``torch.amp.GradScaler(npu_port.get_device().type, ...)`` (``"cuda"`` on CUDA).

    Example::

        scaler = torch.cuda.amp.GradScaler()  # NPU308
    """

    code = "NPU308"
    name = "cuda-grad-scaler"
    message = "a GradScaler for CUDA is disabled (with a warning) elsewhere"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "manual"  # a safe rewrite exists in principle; npu-port fix does not do it yet
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("GradScaler",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            if qualified == "torch.cuda.amp.GradScaler":
                cuda = not cuda_guarded(source, call)
            elif qualified in GRAD_SCALER:
                device = argument(call, 0, "device")  # None: "cuda", torch.amp.GradScaler's default
                cuda = not cuda_guarded(source, call) if device is None else live_cuda_literal(source, device)
            else:
                continue
            if cuda:
                yield source.finding(
                    self,
                    call,
                    "a GradScaler for CUDA warns and runs disabled elsewhere: use "
                    "`torch.amp.GradScaler(npu_port.get_device().type, ...)` (npu-port run redirects it)",
                )
