"""NPU106: a guarded (try / if) import of a CUDA-only or drop-in-served module."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import CUDA_ONLY_PACKAGES, EXTENSION_TRIGGERS, fallback_modules, import_findings, names

_GUARDS = {"try": "inside try/except", "if": "under an if"}


@register_rule
class GuardedCudaImport(Rule):
    """An import of flash_attn, xformers, a compiled extension or another CUDA-only package inside ``try`` (with an
    ``except``) or under an ``if``: the module imports without CUDA and the project takes its other path.

    Worth knowing: under ``npu-port run`` the flash_attn / xformers drop-ins (and the extension fallbacks) make such
    an import succeed, so the project takes its flash / xformers path, computed by ``npu_port.attention``; for the
    other packages the fallback path is what runs on the target — check that it exists and is not much slower.

    Example::

        try:
            import xformers.ops                             # NPU106
        except ImportError:
            xformers = None
    """

    code = "NPU106"
    name = "guarded-cuda-import"
    message = "guarded import of a CUDA-only module: the project's fallback path runs without CUDA"
    severity = "info"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("flash_attn", "xformers", *EXTENSION_TRIGGERS, *CUDA_ONLY_PACKAGES, *fallback_modules())

    def check(self, source: PythonFile) -> Iterator[Finding]:
        def message(kinds, guard, place):
            served = [k for k in kinds if k.kind == "handled"]
            if served:
                what = f"{served[0].by} makes it succeed, so the project takes this path there"
            else:
                what = "without CUDA the project's other path runs; check it exists"
            return f"{names(kinds)} imported {_GUARDS[guard]} {place}: {what}"

        return import_findings(self, source, lambda k, g: g in _GUARDS, message)
