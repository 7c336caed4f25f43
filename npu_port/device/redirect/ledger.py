"""A record of every attribute the redirect replaced, so that undoing it gives back the identical objects.

Patching ``torch.Tensor.cuda`` is subtle: the original lives on ``torch._C.TensorBase``, not in ``torch.Tensor``'s own
``__dict__``. Restoring by ``setattr(torch.Tensor, "cuda", original)`` would leave a new entry behind; the ledger
remembers whether the name was the owner's own and deletes it instead, so lookups resolve exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

_MISSING = object()


@dataclass
class Patch:
    owner: Any
    name: str
    original: Any  # what getattr(owner, name) gave before (_MISSING if nothing)
    own: bool  # whether name was in owner's own __dict__
    replacement: Any


class PatchLedger:
    """Replace attributes, remember what was there, put it all back in reverse order."""

    def __init__(self) -> None:
        self.patches: List[Patch] = []

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        own = name in vars(owner)
        original = vars(owner)[name] if own else getattr(owner, name, _MISSING)
        self.patches.append(Patch(owner, name, original, own, replacement))
        setattr(owner, name, replacement)

    def restore(self) -> None:
        while self.patches:
            patch = self.patches.pop()
            if patch.own:
                setattr(patch.owner, patch.name, patch.original)
            else:
                delattr(patch.owner, patch.name)

    def __len__(self) -> int:
        return len(self.patches)
