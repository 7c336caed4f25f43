# Real-repo patterns: "nccl" as a parameter default forwarded to init_process_group (AnimateDiff train.py
# init_dist), and accelerate's InitProcessGroupKwargs(backend="nccl") (CogVideo finetune/trainer.py).
import os

import torch.distributed as dist
from accelerate.utils import InitProcessGroupKwargs


def init_dist(launcher="slurm", backend="nccl", port=29500, **kwargs):  # expect: NPU311
    if launcher == "pytorch":
        dist.init_process_group(backend=backend, **kwargs)
    return int(os.environ.get("RANK", 0))


def kwargs_handlers(timeout):
    return InitProcessGroupKwargs(backend="nccl", timeout=timeout)  # expect: NPU311
