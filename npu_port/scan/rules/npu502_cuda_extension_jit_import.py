"""NPU502 / NPU503: CUDA sources compiled just in time by ``torch.utils.cpp_extension.load`` / ``load_inline``."""

from __future__ import annotations

import ast
from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._extensions import from_parameter, names_cuda_source
from ._misc import under_cuda_check

LOADERS = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline")


def jit_cuda_loads(source: PythonFile, at_import: bool) -> Iterator[ast.Call]:
    """The ``load`` / ``load_inline`` calls that compile CUDA and run at import time (``at_import``) or later,
    outside any check for CUDA."""
    for call, name in source.calls():
        if name in LOADERS and source.at_import_time(call) == at_import and not under_cuda_check(source, call):
            if compiles_cuda(source, call, name):
                yield call


def compiles_cuda(source: PythonFile, call: ast.Call, name: str) -> bool:
    """Whether a ``load`` / ``load_inline`` call (``name``: which) compiles CUDA: ``.cu`` sources (however the
    list is built: :func:`._extensions.names_cuda_source`) or sources a build helper was given as a parameter,
    ``cuda_sources=``, ``with_cuda=True``."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    with_cuda = keywords.get("with_cuda")
    if isinstance(with_cuda, ast.Constant) and with_cuda.value is False:
        return False
    if isinstance(with_cuda, ast.Constant) and with_cuda.value is True:
        return True
    if name.endswith("load_inline"):
        given = keywords.get("cuda_sources", call.args[2] if len(call.args) > 2 else None)
        return given is not None and not (isinstance(given, ast.Constant) and given.value is None)
    given = keywords.get("sources", call.args[1] if len(call.args) > 1 else None)
    if given is None:
        return False
    # a project's build helper (``def get_plugin(name, sources, ...): load(name, sources=sources)``) loads what its
    # callers give it: ``load`` compiles the ``.cu`` files among them with nvcc
    return names_cuda_source(source, given) or from_parameter(source, given)


@register_rule
class CudaExtensionJitAtImport(Rule):
    """``torch.utils.cpp_extension.load(name, sources=[... ".cu"])`` or ``load_inline(..., cuda_sources=...)`` at a
    module's top level: importing the module compiles CUDA kernels with nvcc.

    Without the CUDA toolkit the import itself fails, so nothing in the module can be used. Move the build into the
    function that needs the kernel, behind a check for CUDA, with a PyTorch fallback (a load under ``if
    torch.cuda.is_available():`` is not reported). The same load inside a function is NPU503.

    Example::

        from torch.utils.cpp_extension import load
        _C = load("fused_bias_act", sources=["fused_bias_act.cpp", "fused_bias_act_kernel.cu"])   # NPU502
    """

    code = "NPU502"
    name = "cuda-extension-jit-at-import"
    message = (
        "compiles CUDA kernels when the module is imported: it fails without nvcc; load lazily, behind a CUDA check"
    )
    severity = "import"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("cpp_extension",)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for call in jit_cuda_loads(source, at_import=True):
            yield source.finding(self, call)
