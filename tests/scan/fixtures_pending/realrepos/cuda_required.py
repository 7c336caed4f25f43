# Real-repo patterns where torch.cuda.is_available() / device_count() does not pick the CPU but stops the program:
# an assert (DiT train.py, sample_ddp.py; Open-Sora opensora/utils/train.py), a raise (Tune-A-Video, AnimateDiff
# attention.py), device_count() as a divisor (DiT, AnimateDiff train.py: ZeroDivisionError) or as a size (Open-Sora
# opensora/utils/cai.py: tp_size = 0). NPU306 reports them as `perf`; they are `runtime`. NPU315 is a PROPOSED code
# (cuda-required, runtime) for these; it does not exist yet.
import os

import torch


def main(rank, tp_size):
    assert torch.cuda.is_available(), "Training currently requires at least one GPU."  # expect: NPU315
    device = rank % torch.cuda.device_count()  # expect: NPU315
    tp_size = min(tp_size, torch.cuda.device_count())  # expect: NPU315
    return device, tp_size


def set_xformers(flag):
    if not torch.cuda.is_available():  # expect: NPU315
        raise ValueError("torch.cuda.is_available() should be True but is False.")
    return flag


def pick():
    return "cuda" if torch.cuda.is_available() else "cpu"  # expect: NPU306
