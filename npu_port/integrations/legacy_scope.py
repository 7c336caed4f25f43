"""Where the attention core of a routed legacy method goes: a target's strategy, the process-wide one, or nowhere.

Legacy attention (a project's copy of diffusers 0.11's ``CrossAttention``, diffusers' ``AttentionBlock``) is routed by
replacing methods on its *class* (:mod:`npu_port.integrations.legacy_attention`), so every instance runs the routed
method — also instances outside the model a strategy was applied to. Two callers install those methods, with
different promises:

* ``patch_legacy_attention(model_or_class)`` (and ``npu-port run``) routes the class *process-wide*: every instance
  goes through ``npu_port.attention``, the process-wide strategy;
* ``set_attention_strategy(strategy, target=model)`` routes the legacy modules *in the target* and changes nothing
  else: its route hooks (:mod:`npu_port.integrations.diffusers.routing`) make the module's route active while the
  module runs, and an instance outside any target must compute exactly what its own code computes.

So the routed method asks, at each call, :func:`attention_for` its class: the active route when a targeted module is
running, else ``npu_port.attention`` while some process-wide patch holds the class, else None — run the original.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Callable, Optional

from torch import Tensor

from .. import _patching
from ..attn.api import attention
from .diffusers.routing import current_route

#: Legacy classes routed process-wide, with how many process-wide patches hold each.
_PROCESS_WIDE: Counter = Counter()

#: The path name a legacy call is counted under in a target's tally.
PATH = "legacy"


def hold_process_wide(cls: type) -> None:
    """A process-wide patch now routes ``cls`` (counted: each hold is released once)."""
    with _patching.LOCK:
        _PROCESS_WIDE[cls] += 1


def release_process_wide(cls: type) -> None:
    with _patching.LOCK:
        _PROCESS_WIDE[cls] -= 1
        if _PROCESS_WIDE[cls] <= 0:
            del _PROCESS_WIDE[cls]


def is_process_wide(cls: type) -> bool:
    return _PROCESS_WIDE.get(cls, 0) > 0


def attention_for(owner: type) -> Optional[Callable[..., Tensor]]:
    """The attention function for a call of a legacy method installed on ``owner`` (SDPA semantics,
    ``(B, H, S, D)``): the running targeted module's route, else the process-wide ``npu_port.attention`` when
    ``owner`` is routed process-wide, else None (the caller runs the original method)."""
    route = current_route()
    if route is not None:
        return functools.partial(route.attend, PATH)
    if is_process_wide(owner):
        return attention
    return None
