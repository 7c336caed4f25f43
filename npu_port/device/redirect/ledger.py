"""A record of every attribute the redirect replaced, so that undoing it gives back the identical objects.

Patching ``torch.Tensor.cuda`` is subtle: the original lives on ``torch._C.TensorBase``, not in ``torch.Tensor``'s own
``__dict__``. The patches are made through :mod:`npu_port._patching`, which remembers whether the name was the owner's
own and deletes it again instead, so lookups resolve exactly as before — and which leaves in place (and says so) an
attribute someone replaced after the redirect, instead of overwriting their patch.
"""

from __future__ import annotations

from typing import Any, List

from ... import _patching

#: The key of the redirect's patches (so ``_patching.active`` can tell them apart).
KEY = "redirect_cuda"


class PatchLedger:
    """Replace attributes, remember what was there, put it all back in reverse order."""

    def __init__(self) -> None:
        self.patches: List[_patching.Patch] = []

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        self.patches.append(_patching.replace(owner, name, replacement, key=KEY))

    def restore(self) -> None:
        with _patching.LOCK:
            while self.patches:
                _patching.release(self.patches.pop())

    def __len__(self) -> int:
        return len(self.patches)
