"""NPU503: CUDA sources compiled just in time, when a function runs."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._extensions import helper_builds
from .npu502_cuda_extension_jit_import import jit_cuda_loads


@register_rule
class CudaExtensionJit(Rule):
    """``torch.utils.cpp_extension.load`` / ``load_inline`` of CUDA sources inside a function: the first call
    compiles CUDA kernels with nvcc.

    Without the CUDA toolkit the call raises when reached. Put it behind a check for CUDA (``if
    torch.cuda.is_available():`` — then it is not reported) with a PyTorch fallback for the kernel. At a module's top
    level it is NPU502.

    A project's own build helper is the same build one call away: ``get_plugin("bias_act", sources=["bias_act.cpp",
    "bias_act.cu"])`` is reported on the ``.cu`` name it is handed (where the CUDA to port is named), and a ``load``
    inside the helper whose sources are the helper's parameter is reported too.

    Example::

        def _ops():
            return load_inline("ops", cpp_sources=CPP, cuda_sources=CUDA, functions=["fused"])   # NPU503
    """

    code = "NPU503"
    name = "cuda-extension-jit"
    message = "compiles CUDA kernels when reached: it raises without nvcc; put it behind a CUDA check with a fallback"
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cpp_extension", ".cu'", '.cu"')

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call in jit_cuda_loads(source, at_import=False):
            yield source.finding(self, call)
        for call, named in helper_builds(source):
            message = (
                f"`{named.value}` is compiled by `{ast.unparse(call.func)}()` when reached: it raises without nvcc; "
                "put the build behind a CUDA check with a fallback"
            )
            yield source.finding(self, named, message)
