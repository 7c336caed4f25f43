"""``npu_port.distributed``: which ``torch.distributed`` backend a device speaks (hccl, nccl, gloo), and an
``init_process_group`` that asks for it. Defined in the device layer (:mod:`npu_port.device.distributed`), where the
CUDA redirect maps ``nccl`` too; this is its public name."""

from .device.distributed import BACKENDS, default_backend, init_process_group, map_backend

__all__ = ["BACKENDS", "default_backend", "init_process_group", "map_backend"]
