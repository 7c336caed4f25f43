"""The device layer: what the machine has, without changing anything until asked.

So far it answers one question the attention kernels need (how much memory is free); detection, the reversible
cuda->npu redirect and ACL options arrive with the device-layer issue. It knows nothing about attention.
"""

from .memory import free_memory_bytes

__all__ = ["free_memory_bytes"]
