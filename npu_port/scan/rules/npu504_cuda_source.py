"""NPU504: a CUDA source file."""

from __future__ import annotations

from typing import Iterator

from ..context import TextFile
from ..rule import Finding, Rule, register_rule


@register_rule
class CudaSource(Rule):
    """A ``.cu`` / ``.cuh`` file: CUDA kernels, which build only with nvcc for NVIDIA GPUs. One finding per file, on
    its first ``__global__`` kernel (else its first line).

    On an NPU or a CPU the extension built from it does not exist: the Python code that calls it needs a PyTorch
    fallback (or an Ascend C port of the kernel). The build itself is reported where it happens (NPU501-NPU503).

    Example: ``csrc/corr_kernel.cu`` with ``__global__ void corr_forward_kernel(...)`` (NPU504).
    """

    code = "NPU504"
    name = "cuda-source"
    message = "CUDA kernel source: it builds only with nvcc; the code that calls it needs a PyTorch fallback on NPU/CPU"
    severity = "info"
    targets = ("npu", "cpu")
    fix = "manual"
    # substrings CUDA sources contain and Python files rarely do (an empty trigger would parse every Python file)
    triggers = ("#include", "__global__", "__device__", "#pragma once")
    file_patterns = ("*.cu", "*.cuh")

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        lines = source.lines
        kernel = next((n for n, line in enumerate(lines, start=1) if "__global__" in line), None)
        yield source.finding(self, kernel or 1)
