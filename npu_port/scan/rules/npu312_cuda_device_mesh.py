"""NPU312: ``init_device_mesh("cuda", ...)``."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import argument, is_cuda_literal

MESH_FUNCTIONS = frozenset(
    (
        "torch.distributed.device_mesh.init_device_mesh",
        "torch.distributed.init_device_mesh",
        "torch.distributed.device_mesh.DeviceMesh",
        "torch.distributed.DeviceMesh",
    )
)


@register_rule
class CudaDeviceMesh(Rule):
    """``init_device_mesh("cuda", (dp, tp))`` / ``DeviceMesh("cuda", ...)``: a device mesh over CUDA devices.

    Without CUDA the mesh cannot be built (no CUDA device, no NCCL). ``npu-port run``'s redirect maps ``nccl``
    process groups but not the mesh's device type, so this needs the change: ``npu-port fix`` writes
    ``init_device_mesh(npu_port.get_device().type, ...)`` (``"cuda"`` on CUDA, ``"npu"`` on Ascend).

    Example::

        mesh = init_device_mesh("cuda", (dp_size, sp_size), mesh_dim_names=("dp", "sp"))  # NPU312
    """

    code = "NPU312"
    name = "cuda-device-mesh"
    message = 'a device mesh over `"cuda"` cannot be built without CUDA'
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"  # a safe rewrite exists in principle; npu-port fix does not do it yet
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            if qualified in MESH_FUNCTIONS:
                value = argument(call, 0, "device_type")
                if is_cuda_literal(value):
                    yield source.finding(
                        self,
                        value,
                        'a device mesh over "cuda" cannot be built without CUDA: use '
                        "`npu_port.get_device().type` as its device type",
                    )
