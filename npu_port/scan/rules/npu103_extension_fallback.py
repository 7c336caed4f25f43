"""NPU103: an import of a compiled CUDA extension that npu-port's fallback serves (RAFT's ``alt_cuda_corr``)."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import FALLBACK_HANDLER, fallback_modules, import_findings, names


@register_rule
class ExtensionFallback(Rule):
    """An unguarded import of a compiled CUDA extension npu-port has a pure-PyTorch fallback for.

    A CUDA extension built by the project's ``setup.py`` (RAFT's ``alt_cuda_corr``) does not build without nvcc and
    cannot be imported where it was not built. Under ``npu-port run`` the fallback is served under the extension's
    own name and computes the same op in PyTorch: nothing to change. Guarded imports are NPU106.

    Example::

        import alt_cuda_corr                                # NPU103
    """

    code = "NPU103"
    name = "cuda-extension-fallback"
    message = "compiled CUDA extension import: npu-port run serves a PyTorch fallback"
    severity = "handled"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    handled_by = FALLBACK_HANDLER
    triggers = tuple(sorted(fallback_modules()))

    def check(self, source: PythonFile) -> Iterator[Finding]:
        def message(kinds, guard, place):
            return (
                f"compiled CUDA extension {names(kinds)} imported unguarded {place}: it does not build without nvcc; "
                "npu-port run serves its PyTorch fallback under the same name (nothing to change)"
            )

        return import_findings(
            self, source, lambda k, g: k.by == FALLBACK_HANDLER and g in ("unguarded", "lazy"), message
        )
