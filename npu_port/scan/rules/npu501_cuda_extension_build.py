"""NPU501: a CUDA extension built by setup.py."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._misc import under_cuda_check

CUDA_EXTENSION = "torch.utils.cpp_extension.CUDAExtension"


@register_rule
class CudaExtensionBuild(Rule):
    """``torch.utils.cpp_extension.CUDAExtension(...)`` — a setup.py (with ``BuildExtension``) that compiles CUDA
    kernels with nvcc when the project is installed.

    Without the CUDA toolkit, ``pip install .`` / ``python setup.py develop`` fails, and the module it would build
    (``alt_cuda_corr``, ``*_cuda``, ``*_C``) is missing at import. Build it only where CUDA is (``if CUDA_HOME is not
    None:`` / ``torch.cuda.is_available()`` — a build under such a check is not reported) and give the Python code a
    PyTorch fallback for the kernel (npu-port has some: ``alt_cuda_corr``).

    Example::

        from torch.utils.cpp_extension import BuildExtension, CUDAExtension
        setup(ext_modules=[CUDAExtension("corr_cuda", ["corr.cpp", "corr_kernel.cu"])],   # NPU501
              cmdclass={"build_ext": BuildExtension})
    """

    code = "NPU501"
    name = "cuda-extension-build"
    message = (
        "CUDAExtension compiles CUDA kernels at install: it fails without nvcc; build it only where CUDA is and give "
        "the code a PyTorch fallback"
    )
    severity = "import"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("CUDAExtension",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call, name in source.calls():
            if name == CUDA_EXTENSION and not under_cuda_check(source, call):
                yield source.finding(self, call)
