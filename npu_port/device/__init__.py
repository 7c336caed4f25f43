"""The device layer: what the machine has, without changing anything until asked.

So far it answers what the attention kernels and ``auto`` need (free memory, synchronising for timing, the device's
model name for cache keys); detection, the reversible cuda->npu redirect and ACL options arrive with the
device-layer issue. It knows nothing about attention.
"""

from .memory import free_memory_bytes
from .sync import device_name, synchronize

__all__ = ["device_name", "free_memory_bytes", "synchronize"]
