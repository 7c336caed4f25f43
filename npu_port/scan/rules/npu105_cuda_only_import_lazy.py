"""NPU105: an unguarded import of a CUDA-only package or extension inside a function."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import CUDA_ONLY_PACKAGES, EXTENSION_TRIGGERS, import_findings, names
from .npu104_cuda_only_import import _why


@register_rule
class CudaOnlyImportLazy(Rule):
    """An import of a CUDA-only package or compiled extension (the ones NPU104 lists) inside a function, with no
    ``try`` around it: the module imports, but the function raises ImportError when it runs.

    Put the import in ``try`` and take another path when it fails, or replace what it is used for.

    Example::

        def build_optimizer(params):
            from apex.optimizers import FusedAdam          # NPU105
            return FusedAdam(params)
    """

    code = "NPU105"
    name = "cuda-only-import-in-function"
    message = "import of a CUDA-only module inside a function: raises ImportError when the function runs"
    severity = "runtime"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("flash_attn", "xformers", *EXTENSION_TRIGGERS, *CUDA_ONLY_PACKAGES)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        def message(kinds, guard, place):
            return f"{names(kinds)} imported {place} with no try: raises ImportError when it runs; " + _why(kinds)

        return import_findings(self, source, lambda k, g: k.kind == "cuda-only" and g == "lazy", message)
