"""NPU602: a CUDA-only package pinned in a requirements file."""

from __future__ import annotations

from typing import Iterator

from ..context import TextFile
from ..rule import Finding, Rule, register_rule
from ._misc import CUDA_PACKAGES, CUDA_PREFIXES, cuda_package, is_requirements, requirement
from .npu601_dropin_requirement import REQUIREMENT_FILES


@register_rule
class CudaRequirement(Rule):
    """A CUDA-only package in a requirements file: apex, bitsandbytes, triton, the ``nvidia-*`` runtime wheels,
    CuPy (``cupy``, ``cupy-cuda12x``), PyCUDA, TensorRT, onnxruntime-gpu, ``spconv-cu*``, liger-kernel,
    sageattention, flash-attention 3, causal-conv1d, mamba-ssm, yunchang, deepspeed-kernels.

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
    file_patterns = REQUIREMENT_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        if not is_requirements(source.path):
            return
        for number, line in enumerate(source.lines, start=1):
            found = requirement(line)
            advice = cuda_package(found[0]) if found is not None else None
            if advice is not None:
                yield source.finding(self, number, f"`{found[0]}` needs CUDA: {advice}")
