"""NPU104: an unguarded module-level import of a CUDA-only package or compiled extension."""

from __future__ import annotations

from typing import Iterator

from ..context import PythonFile
from ..rule import Finding, Rule, register_rule
from ._imports import CUDA_ONLY_PACKAGES, EXTENSION_TRIGGERS, import_findings, names


def _why(kinds) -> str:
    return "; ".join(dict.fromkeys(k.why for k in kinds))


@register_rule
class CudaOnlyImport(Rule):
    """An import that runs when the module is imported, of something that needs CUDA and that npu-port does not
    stand in for: FlashAttention 3 (``flash_attn_interface``), flash_attn / xformers modules the drop-ins do not
    serve (``flash_attn.layers.rotary``, ``flash_attn.ops.triton...``, ``xformers.components``), names the drop-ins
    lack, apex, liger_kernel, sageattention, xfuser / yunchang, bitsandbytes, Transformer Engine, FlashInfer,
    mamba_ssm, and compiled extensions (``*_cuda``, ``*_C``, ``_ext`` modules).

    The module cannot even be imported on an NPU or a CPU, nor under ``npu-port run``. Guard the import and give the
    code a path without it, or replace what it is used for (the message says with what). The project's own modules
    (relative imports, or a folder of that name in the project) never fire; imports inside functions are NPU105,
    guarded ones NPU106.

    Example::

        from flash_attn.layers.rotary import apply_rotary_emb  # NPU104
        import apex                                              # NPU104
        from diff_gaussian_rasterization import _C               # NPU104
    """

    code = "NPU104"
    name = "cuda-only-import"
    message = "unguarded import of a CUDA-only module: the module cannot be imported without CUDA"
    severity = "import"
    targets = ("npu", "cpu", "gpu")
    fix = "manual"
    triggers = ("flash_attn", "xformers", *EXTENSION_TRIGGERS, *CUDA_ONLY_PACKAGES)

    def check(self, source: PythonFile) -> Iterator[Finding]:
        def message(kinds, guard, place):
            return f"{names(kinds)} imported unguarded {place}: the module cannot be imported without CUDA; " + _why(
                kinds
            )

        return import_findings(self, source, lambda k, g: k.kind == "cuda-only" and g == "unguarded", message)
