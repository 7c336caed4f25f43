"""The allocation tracker the tests use to check "never materialises the B*H*Sq*Skv score tensor".

It lives in the package (``npu_port.bench.memory``) because ``npu-port bench`` measures CPU peak memory with it;
this module re-exports it so the tests keep one import path and one implementation.
"""

from __future__ import annotations

from npu_port.bench.memory import AllocationTracker

__all__ = ["AllocationTracker"]
