"""Stand-ins for what a CUDA project needs but this device cannot give it: pure-PyTorch replacements for compiled CUDA
extensions (:mod:`.registry`, served by the import hook of :mod:`npu_port.dropins.finder`; RAFT's ``alt_cuda_corr``
built in, :mod:`.alt_cuda_corr`) and numerically safer math for code that hits cuBLAS errors (:mod:`.safe_math`).

Importing this package imports no torch (:mod:`.alt_cuda_corr` and :mod:`.safe_math` do, when imported).
"""

from .registry import (
    BUILTIN_FALLBACKS,
    FallbackHandle,
    install_builtin_fallbacks,
    register_fallback,
    registered_fallbacks,
    uninstall_builtin_fallbacks,
    unregister_fallback,
)

__all__ = [
    "BUILTIN_FALLBACKS",
    "FallbackHandle",
    "install_builtin_fallbacks",
    "register_fallback",
    "registered_fallbacks",
    "uninstall_builtin_fallbacks",
    "unregister_fallback",
]
