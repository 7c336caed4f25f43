"""npu-port: run CUDA-era PyTorch and diffusers models on Ascend NPUs, new GPUs and CPUs.

The public API is small, in the spirit of ``torch.nn.attention``: the names in :data:`_PUBLIC`, one table from
which ``__all__``, ``__getattr__`` and ``__dir__`` are derived. Everything else lives in its sub-package
(``npu_port.attn``, ``npu_port.strategy``, ``npu_port.device``, ``npu_port.errors``, ``npu_port.dropins``,
``npu_port.fallbacks``, ...). Names are loaded on first use (PEP 562), so ``import npu_port`` — and the ``npu-port``
command — work even when ``import torch`` itself is broken (torch_npu without CANN), and can then say why. Optional
packages (torch_npu, xformers, flash_attn, diffusers, gradio) are never imported at import time.

Names that were public before issue 14 and now live in a sub-package (:data:`_MOVED`) keep working for one release,
each use with a :class:`DeprecationWarning` that names the new place.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Dict, List

# Register the integrations' target appliers (so set_attention_strategy(target=model) always works) and the applier of
# a strategy's fuse_ops key (npu_port.fuse); neither imports torch or diffusers (see npu_port.strategy.appliers).
from . import fuse as _fuse  # noqa: F401
from . import integrations as _integrations  # noqa: F401

#: The public API: name -> the module that defines it (imported when the name is first used; ``masks`` is a module,
#: held by its package).
_PUBLIC: Dict[str, str] = {
    "attention": "npu_port.attn.api",
    "set_attention_strategy": "npu_port.strategy.api",
    "attention_strategy": "npu_port.strategy.api",
    "list_strategies": "npu_port.strategy.registry",
    "register_strategy": "npu_port.strategy.registry",
    "kernels": "npu_port.attn.registry",
    "register_kernel": "npu_port.attn.registry",
    "Kernel": "npu_port.attn.kernels.base",
    "masks": "npu_port.attn",
    "get_device": "npu_port.device.detect",
    "redirect_cuda": "npu_port.device.redirect",
    "apply_npu_options": "npu_port.npu_setup",
    "activate": "npu_port.runtime.activate",
    "patch_legacy_attention": "npu_port.integrations.legacy_attention.patch",
    "register_fallback": "npu_port.fallbacks.registry",
    "fuse_ops": "npu_port.fuse.api",
    "NpuPortError": "npu_port.errors",
    "Reason": "npu_port.reasons",
    "__version__": "npu_port._version",
}

#: Sub-packages reachable as attributes before they are imported (they are modules, not names of the API).
_SUBPACKAGES = ("device", "distributed")

#: Deprecated top-level names (public until issue 14; removed in the next release): name -> where it lives now.
_MOVED: Dict[str, str] = {
    "AttentionCall": "npu_port.attn",
    "get_kernel": "npu_port.attn",
    "kernel_names": "npu_port.attn",
    "runnable_kernels": "npu_port.attn",
    "Strategy": "npu_port.strategy.spec",
    "StrategyHandle": "npu_port.strategy.api",
    "get_strategy": "npu_port.strategy.registry",
    "load_strategy_file": "npu_port.strategy.registry",
    "unregister_strategy": "npu_port.strategy.registry",
    "CudaRedirect": "npu_port.device.redirect",
    "NpuOptionsReport": "npu_port.device.npu_options",
    "Activation": "npu_port.runtime",
    "override": "npu_port.runtime",
    "unregister_fallback": "npu_port.fallbacks",
    "AttentionInputError": "npu_port.errors",
    "DeviceError": "npu_port.errors",
    "KernelOptionError": "npu_port.errors",
    "KernelRuntimeError": "npu_port.errors",
    "KernelUnavailableError": "npu_port.errors",
    "NoKernelError": "npu_port.errors",
    "NpuOptionError": "npu_port.errors",
    "RedirectError": "npu_port.errors",
    "RunError": "npu_port.errors",
    "StrategyError": "npu_port.errors",
    "StrategyFileError": "npu_port.errors",
    "UnknownKernelError": "npu_port.errors",
    "UnknownStrategyError": "npu_port.errors",
}

__all__: List[str] = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    module_name = _PUBLIC.get(name)
    if module_name is not None:
        module = importlib.import_module(module_name)
        value = globals()[name] = getattr(module, name)  # resolved once
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    new_place = _MOVED.get(name)
    if new_place is not None:  # not cached: every use warns
        warnings.warn(f"npu_port.{name} is deprecated; use {new_place}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_place), name)
    raise AttributeError(f"module 'npu_port' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_SUBPACKAGES))
