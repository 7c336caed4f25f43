"""NPU308: a GradScaler for CUDA: ``torch.cuda.amp.GradScaler``, ``torch.amp.GradScaler("cuda")`` or with no device."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import GRAD_SCALER, argument, guarded_finding, is_cuda_literal, literal_part, without_device

#: ``torch.cuda.amp.GradScaler`` under the names it is imported by.
CUDA_AMP_SCALER = ("torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler")


@register_rule
class CudaGradScaler(Rule):
    """A gradient scaler for CUDA: ``torch.cuda.amp.GradScaler()``, ``torch.amp.GradScaler("cuda")`` and
    ``torch.amp.GradScaler()`` with no device (which means CUDA).

    Without CUDA torch warns "GradScaler is enabled, but CUDA is not available. Disabling." and scaling is off: float16
    training on an NPU then underflows its gradients. ``npu-port run``'s redirect gives the scaler the target's
    device. ``npu-port fix`` writes ``npu_port.device.grad_scaler(...)`` with the same scaler arguments (the device
    argument dropped): on CUDA ``torch.amp.GradScaler("cuda", ...)``, which ``torch.cuda.amp.GradScaler`` is. A
    helper, not ``torch.amp.GradScaler(npu_port.get_device().type, ...)``, because that class exists from torch 2.3
    only, and on an NPU the scaler to use is torch_npu's, which also sees overflow on chips that saturate instead of
    giving inf (see :func:`npu_port.device.grad_scaler`). Left to fix by hand: a device other than a plain ``"cuda"``,
    and ``torch.amp.GradScaler(*args)`` (the device may be in ``args``). That is ``--target npu-port``; by default
    (torch >= 2.6, where ``torch.amp.GradScaler`` takes any device) ``fix`` writes torch's own
    ``torch.amp.GradScaler(<device type>, ...)`` with NPU310's device expression: CUDA's scaler on CUDA, the NPU's
    with torch_npu, the CPU's (enabled) where there is no accelerator.

    Example::

        scaler = torch.cuda.amp.GradScaler()  # NPU308 -> npu_port.device.grad_scaler()
        scaler = torch.amp.GradScaler("cuda", init_scale=1024)  # NPU308 -> npu_port.device.grad_scaler(init_scale=1024)
    """

    code = "NPU308"
    name = "cuda-grad-scaler"
    message = "a GradScaler for CUDA is disabled (with a warning) elsewhere"
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("GradScaler",)
    fix_imports = ("npu_port",)
    fix_replaces = (*CUDA_AMP_SCALER, *GRAD_SCALER)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            at: ast.AST = call
            if qualified in CUDA_AMP_SCALER:
                first = call.args[0] if call.args else None  # a string there would read as a device in rewrite()
                fixable = not (isinstance(first, ast.Constant) and isinstance(first.value, str))
            elif qualified in GRAD_SCALER:
                device = argument(call, 0, "device")  # None: "cuda", torch.amp.GradScaler's default
                if device is not None and not is_cuda_literal(device):
                    continue
                at = call if device is None else literal_part(source, device)
                plain = device is None or (isinstance(device, ast.Constant) and device.value == "cuda")
                fixable = plain and not any(isinstance(a, ast.Starred) for a in call.args)
            else:
                continue
            yield guarded_finding(
                source,
                self,
                call,
                "a GradScaler for CUDA warns and runs disabled elsewhere: use `npu_port.device.grad_scaler(...)`, "
                "the scaler for the detected device (npu-port run redirects it)",
                fix=None if fixable else "manual",
                at=at,
            )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """``torch.cuda.amp.GradScaler(...)`` -> ``npu_port.device.grad_scaler(...)``, the arguments as they are (the
        same parameters in the same order); ``torch.amp.GradScaler("cuda", ...)`` / ``(device="cuda", ...)`` -> the
        same less the device. A first positional string or a ``device=`` keyword is that device: the check made the
        fix safe only where it is a plain ``"cuda"`` (``torch.cuda.amp.GradScaler`` takes neither)."""
        import libcst as cst

        from ..targets import call_for, expression

        if not isinstance(node, cst.Call):
            return None
        func = cst.parse_expression(expression("grad_scaler", self.target))
        args = without_device(node, "device")
        return node.with_changes(
            func=func, args=call_for("grad_scaler", self.target, list(node.args if args is None else args))
        )
