"""The built-in attention kernels; importing this package registers them.

Each kernel is one module with one job; none imports its optional package at import time. ``BUILTIN_ORDER`` is the
documented listing order (reference first, then portable, then device-specific), independent of import order.
"""

from . import chunked, flash_attn, math, npu_fused_infer, npu_fusion, sdpa, xformers  # noqa: F401  (registration)

BUILTIN_ORDER = ("math", "sdpa", "chunked", "npu_fusion", "npu_fused_infer", "xformers", "flash_attn")
