"""The portable attention core: one SDPA-compatible call, kernels that explain refusals, canonical masks.

The package is `attn` so that `npu_port.attention` can be the function users call.
"""

from . import masks
from .api import attention
from .call import AttentionCall
from .kernels.base import FromStrategy, Kernel, Option
from .kernels.chunked import ChunkPlan
from .registry import (
    default_order,
    get_kernel,
    kernel_names,
    kernels,
    priority_order,
    register_kernel,
    unregister_kernel,
)
from .select import runnable_kernels

__all__ = [
    "DEFAULT_ORDER",
    "AttentionCall",
    "ChunkPlan",
    "FromStrategy",
    "Kernel",
    "Option",
    "attention",
    "default_order",
    "get_kernel",
    "kernel_names",
    "kernels",
    "masks",
    "priority_order",
    "register_kernel",
    "runnable_kernels",
    "unregister_kernel",
]


def __getattr__(name: str):
    if name == "DEFAULT_ORDER":  # derived from the registry on every read (a kernel registered later is in it)
        return tuple(default_order())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
