"""NPU309: ``torch.Generator("cuda")``."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import GENERATOR, argument, guarded_finding, is_cuda_literal, literal_part
from .npu310_cuda_device_literal import CudaDeviceLiteral
from .npu310_cuda_device_literal import _plain as plain_literal


@register_rule
class CudaGenerator(Rule):
    """``torch.Generator("cuda")`` / ``torch.Generator(device="cuda")`` (diffusers pipelines' seeded generators).

    Without CUDA it raises "Cannot get CUDA generator without ATen_cuda library". ``npu-port run``'s redirect
    makes the generator on the target. ``npu-port fix`` rewrites the device as NPU310 rewrites a device literal:
    ``torch.Generator(npu_port.get_device().type)`` — ``"cuda"`` on CUDA, the same generator, on the current device
    as before (``npu_port.get_device()`` would be ``cuda:0``); ``"npu"`` on an NPU, where torch_npu makes NPU
    generators; ``"cpu"`` on a CPU (by default torch's own device-agnostic expression, see NPU310).
    ``"cuda:1"`` keeps its index. ``torch.Generator(device=torch.device("cuda"))`` is
    NPU310's (its ``"cuda"`` is a ``torch.device`` argument), fixed the same way. Left to fix by hand: an f-string or
    ``"cuda" if ... else "cpu"`` (which device is the project's choice). Note that a generator on another device
    draws a different random stream than CUDA's for the same seed.

    Example::

        g = torch.Generator("cuda").manual_seed(0)  # NPU309 -> torch.Generator(npu_port.get_device().type)
    """

    code = "NPU309"
    name = "cuda-generator"
    message = '`torch.Generator("cuda")` raises without CUDA'
    severity = "handled"
    targets = ("npu", "cpu")
    fix = "safe"
    handled_by = "npu-port run (the CUDA redirect)"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device
    fix_imports = ("npu_port",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            device = argument(call, 0, "device")
            if qualified in GENERATOR and is_cuda_literal(device):
                yield guarded_finding(
                    source,
                    self,
                    call,
                    '`torch.Generator("cuda")` raises without CUDA: use '
                    "`torch.Generator(npu_port.get_device().type)` (npu-port run redirects it)",
                    fix=None if plain_literal(device) else "manual",
                    at=literal_part(source, device),  # type: ignore[arg-type]
                )

    def rewrite(self, node: Any, finding: Finding) -> Optional[Any]:
        """The device of ``torch.Generator("cuda")`` / ``(device="cuda:1")`` rewritten as NPU310 rewrites a device
        literal (the check made the fix safe only for a plain ``"cuda"`` / ``"cuda:N"``)."""
        import libcst as cst

        if not isinstance(node, cst.Call):
            return None
        for index, arg in enumerate(node.args):
            if (arg.keyword is None and index == 0) or (arg.keyword is not None and arg.keyword.value == "device"):
                literal = CudaDeviceLiteral()
                literal.target = self.target
                device = literal.rewrite(arg.value, finding)  # None unless a plain "cuda" / "cuda:N"
                if device is None:
                    return None
                args = list(node.args)
                args[index] = arg.with_changes(value=device)
                return node.with_changes(args=args)
        return None
