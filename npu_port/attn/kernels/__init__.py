"""The built-in attention kernels; importing this package registers them, in this (documented) order.

Each kernel is one module with one job; none imports its optional package at import time.
"""

from . import math, sdpa, chunked, npu_fusion, npu_fused_infer, xformers, flash_attn  # noqa: F401  (registration)
