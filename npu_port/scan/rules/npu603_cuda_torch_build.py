"""NPU603: a CUDA build of torch pinned in a requirements file."""

from __future__ import annotations

import re
from typing import Iterator

from ..context import TextFile
from ..rule import Finding, Rule, register_rule
from ._misc import DEPENDENCY_FILES, dependencies, is_requirements

_LOCAL_CUDA = re.compile(r"\+cu\d+")
_CUDA_INDEX = re.compile(r"^\s*--(?:extra-)?index-url[\s=]+\S*/whl/cu\d+", re.IGNORECASE)
_TORCH = ("torch", "torchvision", "torchaudio", "pytorch")
#: conda packages that exist to give PyTorch CUDA: the CUDA runtime PyTorch's conda builds pull in.
_CONDA_CUDA = ("pytorch-cuda", "cudatoolkit", "cuda-toolkit", "cudatoolkit-dev", "cuda-runtime", "cuda-cudart")


@register_rule
class CudaTorchBuild(Rule):
    """A CUDA build of PyTorch in a requirements file: a ``+cuXXX`` local version (``torch==2.1.0+cu118``) or
    PyTorch's CUDA wheel index (``--extra-index-url https://download.pytorch.org/whl/cu121``); in a conda environment,
    ``pytorch-cuda=11.7`` / ``cudatoolkit=11.3`` or a ``pytorch`` pinned to a ``cuda`` build string.

    torch_npu needs the matching plain (CPU) build of torch, and Ascend hosts are mostly aarch64, where PyTorch
    publishes no ``+cu`` wheels: pip fails, or installs a build torch_npu does not support. Pin the plain version
    (``torch==2.1.0``) and keep the CUDA index in a CUDA-only requirements file.

    Example::

        --extra-index-url https://download.pytorch.org/whl/cu118   # NPU603
        torch==2.1.0+cu118                                          # NPU603
        - pytorch-cuda=11.7                                         # NPU603 (environment.yml)
    """

    code = "NPU603"
    name = "cuda-torch-build"
    message = "CUDA build of torch: pin the plain version (torch_npu needs the CPU build)"
    severity = "import"
    targets = ("npu",)
    fix = "manual"
    triggers = ("+cu", "/whl/cu", "pytorch-cuda", "cudatoolkit", "cuda-toolkit", "cuda-runtime", "cuda-cudart", "_cuda")
    file_patterns = DEPENDENCY_FILES

    def check_text(self, source: TextFile) -> Iterator[Finding]:
        if is_requirements(source.path) and not source.path.endswith((".yml", ".yaml", ".toml")):
            for number, line in enumerate(source.lines, start=1):
                if _CUDA_INDEX.search(line):
                    yield source.finding(
                        self,
                        number,
                        "PyTorch's CUDA wheel index: leave it out on the target (torch_npu needs the CPU torch)",
                    )
        for number, package, rest, via in dependencies(source.path, source.lines):
            if via == "conda" and package in _CONDA_CUDA:
                yield source.finding(
                    self,
                    number,
                    f"`{package}` is the CUDA runtime of PyTorch's conda build: leave it out on the target "
                    "(torch_npu needs the CPU torch: `pytorch` with `cpuonly`, or pip's plain `torch`)",
                )
            elif package in _TORCH and (_LOCAL_CUDA.search(rest) or (via == "conda" and "cuda" in rest)):
                yield source.finding(
                    self,
                    number,
                    f"`{package}` pinned to a CUDA build: pin the plain version (torch_npu needs the CPU build)",
                )
