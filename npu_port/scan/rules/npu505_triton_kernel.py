"""NPU505: a Triton kernel (``@triton.jit``)."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule

#: Decorators that make (or wrap) a Triton kernel.
_KERNEL_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics", "triton.runtime.jit.jit")


@register_rule
class TritonKernel(Rule):
    """A Triton kernel: a function decorated with ``@triton.jit`` (or ``@triton.autotune`` / ``@triton.heuristics``
    over one), however ``triton`` is imported. One finding per kernel, on its first Triton decorator.

    Triton compiles kernels for the GPUs it has a backend for (CUDA, ROCm): on a CPU, launching one raises (no
    active driver), and on an Ascend NPU it needs triton-ascend, whose kernels differ in what they support (block
    sizes, some ``tl`` ops). ``import triton`` may well work where a launch does not. npu-port has no fallback for
    a project's own kernels: keep a PyTorch path for NPU/CPU (most Triton kernels in diffusion code fuse a norm, an
    activation or RoPE that PyTorch computes unfused), chosen by the device — or port the kernel to triton-ascend.

    Example::

        @triton.jit                                   # NPU505
        def _rms_norm_fwd(X, Y, W, stride, N, eps, BLOCK: tl.constexpr):
            ...
    """

    code = "NPU505"
    name = "triton-kernel"
    message = "a Triton kernel runs only where Triton has a GPU backend (CUDA, ROCm; triton-ascend on Ascend)"
    severity = "runtime"
    targets = ("npu", "cpu")
    fix = "manual"
    triggers = ("triton",)
    #: ... and a decorator that can be a kernel's (torch's tree names triton in hundreds of files without one)
    also_triggers = (re.compile(r"@\s*[\w.]*(?:jit|autotune|heuristics)\b"),)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        for function in source.of(ast.FunctionDef):
            decorator = _kernel_decorator(source, function)  # type: ignore[arg-type]
            if decorator is not None:
                yield source.finding(
                    self,
                    decorator,
                    f"`{function.name}` is a Triton kernel: it runs only where Triton has a GPU backend (CUDA, ROCm; "  # type: ignore[attr-defined]
                    "triton-ascend on Ascend, with its own limits): keep a PyTorch path for NPU/CPU",
                )


def _kernel_decorator(source: PythonFile, function: ast.FunctionDef) -> Optional[ast.AST]:
    for decorator in function.decorator_list:
        if source.resolve(decorator) in _KERNEL_DECORATORS:  # @triton.jit, @triton.jit(...), @jit (from triton)
            return decorator
    return None
