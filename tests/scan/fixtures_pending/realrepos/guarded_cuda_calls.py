# Real-repo patterns: CUDA calls that only run when torch.cuda.is_available() said True (CogVideo
# finetune/utils/memory_utils.py, tools/caption/video_caption.py; the `"cuda" if ... else "cpu"` idiom in DiT sample.py,
# Open-Sora scripts/*/inference.py, 10 CogVideo files). Nothing raises without CUDA: the only effect is the CPU path
# (NPU306). Today the scan adds NPU310 / NPU304 / NPU302 "raises without CUDA" on top.
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"  # expect: NPU306
TORCH_TYPE = (
    torch.bfloat16
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8  # expect: NPU306
    else torch.float16
)


def get_memory_statistics():
    memory_allocated = None
    if torch.cuda.is_available():  # expect: NPU306
        device = torch.cuda.current_device()
        memory_allocated = torch.cuda.memory_allocated(device)
    return memory_allocated


def free_memory():
    if torch.cuda.is_available():  # expect: NPU306
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()
