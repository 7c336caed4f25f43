# Real-repo pattern (CogVideo inference/gradio_composite_demo/rife/RIFE.py): `torch` reaches the module only through
# `from .IFNet import *`, so the resolver does not know it; the same line in the sibling files that `import torch`
# is reported. The conventional name `torch`, unbound except by a star import, should resolve to torch.
from .IFNet import *  # noqa: F403

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # expect: NPU306


def sync():
    torch.cuda.synchronize()  # expect: NPU302
