# Real-repo pattern (CogVideo sat/vae_modules/attention.py, RAFT core/raft.py and train.py): a CUDA API bound in one
# branch of an if/else or try/except, a stand-in bound in the other. The CUDA binding is the one that runs wherever
# the import works (any torch >= 1.6 / 2.0), so the name must resolve to it, not to the later stand-in.
from contextlib import nullcontext

import torch
from packaging import version

if version.parse(torch.__version__) >= version.parse("2.0.0"):
    from torch.backends.cuda import SDPBackend, sdp_kernel
else:
    sdp_kernel = nullcontext

try:
    autocast = torch.cuda.amp.autocast
except AttributeError:

    class autocast:  # dummy autocast for PyTorch < 1.6
        def __init__(self, enabled):
            pass

        def __enter__(self):
            pass

        def __exit__(self, *args):
            pass


try:
    from torch.cuda.amp import GradScaler
except ImportError:

    class GradScaler:  # dummy GradScaler for PyTorch < 1.6
        def __init__(self, enabled=False):
            pass


def attention(q, k, v, mixed_precision):
    with sdp_kernel(enable_math=True, enable_flash=False):  # expect: NPU314
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with autocast(enabled=mixed_precision):  # expect: NPU307
        out = out * 2
    scaler = GradScaler(enabled=mixed_precision)  # expect: NPU308
    return out, scaler, SDPBackend
