"""The portable attention core: one SDPA-compatible call, kernels that explain refusals, canonical masks.

The package is `attn` so that `npu_port.attention` can be the function users call.
"""

from . import masks
from .api import attention
from .call import AttentionCall
from .kernels.base import Kernel, Option
from .kernels.chunked import ChunkPlan
from .registry import get_kernel, kernel_names, kernels, register_kernel
from .select import DEFAULT_ORDER, runnable_kernels

__all__ = [
    "DEFAULT_ORDER",
    "AttentionCall",
    "ChunkPlan",
    "Kernel",
    "Option",
    "attention",
    "get_kernel",
    "kernel_names",
    "kernels",
    "masks",
    "register_kernel",
    "runnable_kernels",
]
