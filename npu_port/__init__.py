"""npu-port: run CUDA-era PyTorch and diffusers models on Ascend NPUs, new GPUs and CPUs.

The public API lives here. Names are loaded on first use (PEP 562), so ``import npu_port`` — and the ``npu-port``
command — work even when ``import torch`` itself is broken (torch_npu without CANN), and can then say why. Optional
packages (torch_npu, xformers, flash_attn, diffusers, gradio) are never imported at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

from ._version import __version__
from .errors import (
    AttentionInputError,
    KernelOptionError,
    KernelRuntimeError,
    KernelUnavailableError,
    NoKernelError,
    NpuPortError,
    UnknownKernelError,
)
from .reasons import Reason

#: Public name -> the module that defines it (imported when the name is first used).
_LAZY: Dict[str, str] = {
    "attention": "npu_port.attn.api",
    "AttentionCall": "npu_port.attn.call",
    "Kernel": "npu_port.attn.kernels.base",
    "get_kernel": "npu_port.attn.registry",
    "kernel_names": "npu_port.attn.registry",
    "kernels": "npu_port.attn.registry",
    "register_kernel": "npu_port.attn.registry",
    "runnable_kernels": "npu_port.attn.select",
    "masks": "npu_port.attn.masks",
}

if TYPE_CHECKING:  # static analysers see the real objects
    from .attn import masks
    from .attn.api import attention
    from .attn.call import AttentionCall
    from .attn.kernels.base import Kernel
    from .attn.registry import get_kernel, kernel_names, kernels, register_kernel
    from .attn.select import runnable_kernels


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'npu_port' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if name == "masks" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AttentionCall",
    "AttentionInputError",
    "Kernel",
    "KernelOptionError",
    "KernelRuntimeError",
    "KernelUnavailableError",
    "NoKernelError",
    "NpuPortError",
    "Reason",
    "UnknownKernelError",
    "__version__",
    "attention",
    "get_kernel",
    "kernel_names",
    "kernels",
    "masks",
    "register_kernel",
    "runnable_kernels",
]
