"""The device layer: what the machine has, and — only when asked — making CUDA-written code run on it.

Detection is honest (:mod:`.detect`), the ``torch.cuda.*`` housekeeping calls have device-generic stand-ins
(:mod:`.helpers`), the cuda -> device redirect is scoped and reversible (:mod:`.redirect`), and Ascend's runtime
options are validated before they are set (:mod:`.npu_options`). It knows nothing about attention.
"""

from .detect import (
    DEVICE_TYPES,
    ENV_VARIABLE,
    BackendStatus,
    available_device_types,
    backend_status,
    backends,
    get_device,
)
from .helpers import (
    autocast,
    autocast_device_type,
    autocast_dtype,
    device_count,
    empty_cache,
    grad_scaler,
    manual_seed,
    max_memory_allocated,
    mem_get_info,
    memory_allocated,
    reset_peak_memory_stats,
    synchronize,
)
from .memory import free_memory_bytes, host_memory_bytes
from .rng import preserved_rng
from .sync import device_name

__all__ = [
    "DEVICE_TYPES",
    "ENV_VARIABLE",
    "BackendStatus",
    "autocast",
    "autocast_device_type",
    "autocast_dtype",
    "available_device_types",
    "backend_status",
    "backends",
    "device_count",
    "device_name",
    "empty_cache",
    "free_memory_bytes",
    "get_device",
    "grad_scaler",
    "host_memory_bytes",
    "manual_seed",
    "max_memory_allocated",
    "mem_get_info",
    "memory_allocated",
    "preserved_rng",
    "reset_peak_memory_stats",
    "synchronize",
]
