# Real-repo pattern (HunyuanVideo-1.5 hyvideo/commons/parallel_states.py): "cuda" handed to the project's own method,
# which builds the device mesh with it. generate.py builds this object at import time, so the whole entry point fails
# without CUDA; the scan says nothing today (no NPU310 on the argument, no NPU312 on the mesh).
from dataclasses import dataclass

from torch.distributed.device_mesh import init_device_mesh


@dataclass
class ParallelDims:
    sp: int = 1
    world_size: int = 1

    def __post_init__(self):
        self.build_mesh("cuda")  # expect: NPU312

    def build_mesh(self, device_type):
        return init_device_mesh(device_type, [self.world_size // self.sp, self.sp], mesh_dim_names=["dp", "sp"])

