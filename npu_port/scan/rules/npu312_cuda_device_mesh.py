"""NPU312: ``init_device_mesh("cuda", ...)``."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._device import argument, cuda_branch_note, is_cuda_literal, parameter_sources
from .npu310_cuda_device_literal import CudaDeviceLiteral

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

    Also ``"cuda"`` handed to the file's own function or method whose parameter becomes the mesh's device type
    (``self.build_mesh("cuda")`` with ``def build_mesh(self, device_type): init_device_mesh(device_type, ...)``), or
    that parameter's default: the finding is on the ``"cuda"``. Reported under ``if torch.cuda.is_available():`` too
    (``npu-port run --cuda-available`` takes that branch, and then it raises).

    Without CUDA the mesh cannot be built (no CUDA device, no NCCL). ``npu-port run``'s redirect maps ``nccl``
    process groups but not the mesh's device type, so this needs the change: ``npu-port fix`` writes
    ``init_device_mesh(<device type>, ...)`` as NPU310 writes it (``"cuda"`` on CUDA, ``"npu"`` on Ascend) for a plain
    ``"cuda"`` argument; a parameter default (evaluated at import) and a computed string are left to you.

    Example::

        mesh = init_device_mesh("cuda", (dp_size, sp_size), mesh_dim_names=("dp", "sp"))  # NPU312
    """

    code = "NPU312"
    name = "cuda-device-mesh"
    message = 'a device mesh over `"cuda"` cannot be built without CUDA'
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "safe"
    triggers = ("cuda",)  # every form names cuda: torch.cuda.* or a "cuda" device

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, qualified in source.calls():
            if qualified not in MESH_FUNCTIONS:
                continue
            value = argument(call, 0, "device_type")
            if is_cuda_literal(value):
                places = [(value, "", "argument")]
            else:  # the device type is a parameter: what the file's own calls (or its default) give it
                places = [
                    (node, f" (given to `{function}`, which builds a device mesh with it)", kind)
                    for node, kind, function in parameter_sources(source, value)
                    if is_cuda_literal(node)
                ]
            for node, through, kind in places:
                plain = isinstance(node, ast.Constant) and node.value == "cuda" and kind == "argument"
                guarded = cuda_branch_note(source, node)
                yield source.finding(
                    self,
                    node,
                    f'a device mesh over "cuda"{through} cannot be built without CUDA{guarded}: use '
                    "`npu_port.get_device().type` as its device type",
                    fix=None if plain else "manual",  # a default is evaluated at import: set it in the body
                )

    fix_imports = ("npu_port",)
    #: ``"cuda"`` -> ``npu_port.get_device().type``, as NPU310 writes it (``"cuda"`` on CUDA).
    rewrite = CudaDeviceLiteral.rewrite
