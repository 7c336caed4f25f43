"""NPU603: a CUDA build of torch pinned in a requirements file."""

from __future__ import annotations

import re
from typing import Iterator

from ..context import TextFile
from ..rule import Finding, Rule, register_rule
from ._misc import is_requirements, requirement
from .npu601_dropin_requirement import REQUIREMENT_FILES

_LOCAL_CUDA = re.compile(r"\+cu\d+")
_CUDA_INDEX = re.compile(r"^\s*--(?:extra-)?index-url[\s=]+\S*/whl/cu\d+", re.IGNORECASE)
_TORCH = ("torch", "torchvision", "torchaudio")


@register_rule
class CudaTorchBuild(Rule):
    """A CUDA build of PyTorch in a requirements file: a ``+cuXXX`` local version (``torch==2.1.0+cu118``) or
    PyTorch's CUDA wheel index (``--extra-index-url https://download.pytorch.org/whl/cu121``).

    torch_npu needs the matching plain (CPU) build of torch, and Ascend hosts are mostly aarch64, where PyTorch
    publishes no ``+cu`` wheels: pip fails, or installs a build torch_npu does not support. Pin the plain version
    (``torch==2.1.0``) and keep the CUDA index in a CUDA-only requirements file.

    Example::

        --extra-index-url https://download.pytorch.org/whl/cu118   # NPU603
        torch==2.1.0+cu118                                          # NPU603
    """

    code = "NPU603"
    name = "cuda-torch-build"
    message = "CUDA build of torch: pin the plain version (torch_npu needs the CPU build)"
    severity = "import"
    targets = ("npu",)
    fix = "manual"
    triggers = ("+cu", "/whl/cu")
    file_patterns = REQUIREMENT_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        if not is_requirements(source.path):
            return
        for number, line in enumerate(source.lines, start=1):
            if _CUDA_INDEX.search(line):
                yield source.finding(
                    self,
                    number,
                    "PyTorch's CUDA wheel index: leave it out on the target (torch_npu needs the CPU torch)",
                )
                continue
            found = requirement(line)
            if found is not None and found[0] in _TORCH and _LOCAL_CUDA.search(found[1]):
                yield source.finding(
                    self,
                    number,
                    f"`{found[0]}` pinned to a CUDA build: pin the plain version (torch_npu needs the CPU build)",
                )
