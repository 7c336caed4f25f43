"""NPU602: a CUDA-only package pinned in a requirements file."""

from __future__ import annotations

from typing import Iterator

from ..context import TextFile
from ..rule import Finding, Rule, register_rule
from ._misc import CUDA_PACKAGES, CUDA_PREFIXES, DEPENDENCY_FILES, cuda_package, dependencies


@register_rule
class CudaRequirement(Rule):
    """A CUDA-only package in a requirements file, a conda environment or a pyproject.toml: apex, bitsandbytes,
    triton, the ``nvidia-*`` runtime wheels, CuPy (``cupy``, ``cupy-cuda12x``), PyCUDA, TensorRT, onnxruntime-gpu,
    ``spconv-cu*``, liger-kernel, sageattention, flash-attention 3, causal-conv1d, mamba-ssm, yunchang,
    deepspeed-kernels.

    pip cannot install them on an NPU or CPU machine (no CUDA to build against, or no wheel), or they install and
    fail when their kernels run; code that imports them unguarded fails at import. npu-port has no drop-in for these:
    the finding says what to use instead. (flash-attn and xformers are NPU601.)

    Example::

        apex @ git+https://github.com/NVIDIA/apex   # NPU602
        nvidia-cudnn-cu12==8.9.2.26                 # NPU602
    """

    code = "NPU602"
    name = "cuda-requirement"
    message = "pinned package needs CUDA"
    severity = "import"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = tuple(CUDA_PACKAGES) + tuple(CUDA_PREFIXES) + ("Apex", "Triton", "CuPy", "NVIDIA")
    file_patterns = DEPENDENCY_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        for number, package, _, _ in dependencies(source.path, source.lines):
            advice = cuda_package(package)
            if advice is not None:
                yield source.finding(self, number, f"`{package}` needs CUDA: {advice}")
