"""npu-port: run CUDA-era PyTorch and diffusers models on Ascend NPUs, new GPUs and CPUs.

The public API lives here. Names are loaded on first use (PEP 562), so ``import npu_port`` — and the ``npu-port``
command — work even when ``import torch`` itself is broken (torch_npu without CANN), and can then say why. Optional
packages (torch_npu, xformers, flash_attn, diffusers, gradio) are never imported at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

from . import integrations as _integrations  # noqa: F401  (registers the target appliers; no torch, no diffusers)
from ._version import __version__
from .errors import (
    AttentionInputError,
    DeviceError,
    KernelOptionError,
    KernelRuntimeError,
    KernelUnavailableError,
    NoKernelError,
    NpuOptionError,
    NpuPortError,
    RedirectError,
    RunError,
    StrategyError,
    StrategyFileError,
    UnknownKernelError,
    UnknownStrategyError,
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
    "get_device": "npu_port.device.detect",
    "activate": "npu_port.runtime.activate",
    "override": "npu_port.runtime.overrides",
    "patch_legacy_attention": "npu_port.integrations.legacy_attention",
    "register_fallback": "npu_port.fallbacks.registry",
    "unregister_fallback": "npu_port.fallbacks.registry",
    "Activation": "npu_port.runtime.activate",
    "redirect_cuda": "npu_port.device.redirect",
    "CudaRedirect": "npu_port.device.redirect",
    "device": "npu_port.device",
    "distributed": "npu_port.distributed",
    "Strategy": "npu_port.strategy.spec",
    "StrategyHandle": "npu_port.strategy.api",
    "attention_strategy": "npu_port.strategy.api",
    "set_attention_strategy": "npu_port.strategy.api",
    "get_strategy": "npu_port.strategy.registry",
    "list_strategies": "npu_port.strategy.registry",
    "load_strategy_file": "npu_port.strategy.registry",
    "register_strategy": "npu_port.strategy.registry",
    "unregister_strategy": "npu_port.strategy.registry",
    "apply_npu_options": "npu_port.npu_setup",
    "NpuOptionsReport": "npu_port.device.npu_options",
}

if TYPE_CHECKING:  # static analysers see the real objects
    from . import device, distributed
    from .attn import masks
    from .attn.api import attention
    from .attn.call import AttentionCall
    from .attn.kernels.base import Kernel
    from .attn.registry import get_kernel, kernel_names, kernels, register_kernel
    from .attn.select import runnable_kernels
    from .device.detect import get_device
    from .device.npu_options import NpuOptionsReport
    from .device.redirect import CudaRedirect, redirect_cuda
    from .fallbacks.registry import register_fallback, unregister_fallback
    from .integrations.legacy_attention import patch_legacy_attention
    from .npu_setup import apply_npu_options
    from .runtime.activate import Activation, activate
    from .runtime.overrides import override
    from .strategy.api import StrategyHandle, attention_strategy, set_attention_strategy
    from .strategy.registry import (
        get_strategy,
        list_strategies,
        load_strategy_file,
        register_strategy,
        unregister_strategy,
    )
    from .strategy.spec import Strategy


#: Lazy names that are modules themselves rather than attributes of one.
_MODULES = frozenset({"masks", "device", "distributed"})


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'npu_port' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Activation",
    "activate",
    "override",
    "RunError",
    "patch_legacy_attention",
    "register_fallback",
    "unregister_fallback",
    "CudaRedirect",
    "device",
    "distributed",
    "get_device",
    "redirect_cuda",
    "AttentionCall",
    "Strategy",
    "StrategyError",
    "StrategyFileError",
    "StrategyHandle",
    "UnknownStrategyError",
    "attention_strategy",
    "get_strategy",
    "list_strategies",
    "load_strategy_file",
    "register_strategy",
    "set_attention_strategy",
    "unregister_strategy",
    "AttentionInputError",
    "DeviceError",
    "RedirectError",
    "Kernel",
    "KernelOptionError",
    "KernelRuntimeError",
    "KernelUnavailableError",
    "NoKernelError",
    "NpuOptionError",
    "NpuOptionsReport",
    "NpuPortError",
    "Reason",
    "UnknownKernelError",
    "__version__",
    "apply_npu_options",
    "attention",
    "get_kernel",
    "kernel_names",
    "kernels",
    "masks",
    "register_kernel",
    "runnable_kernels",
]
