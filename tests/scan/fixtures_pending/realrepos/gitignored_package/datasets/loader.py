# Tracked in git although the .gitignore beside the package names its folder (added with `git add -f`, as the real
# repositories' files were committed before the pattern). The scan must read it: git ignores only untracked files.
import torch


def to_device(batch):
    return {key: value.cuda() for key, value in batch.items()}  # expect: NPU301


def pin(x):
    return torch.zeros(4, device="cuda") + x  # expect: NPU310
