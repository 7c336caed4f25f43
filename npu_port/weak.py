"""Referring to a user's model without keeping it alive.

npu-port's bookkeeping (a strategy handle, the record of what was applied where, the watchers of ``set_processor``)
outlives the calls that made it, and sits in module-level tables. If any of it held a model strongly, a model the
user dropped without calling ``restore()`` would never be freed — on an accelerator, one model's device memory per
swapped pipeline. So every reference from our records to a user's object goes through :func:`weak`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional


def weak(obj: Any) -> Callable[[], Optional[Any]]:
    """A zero-argument callable that gives ``obj`` back while it lives and None once it is gone.

    ``None`` gives a callable that always answers None; an object that cannot be weakly referenced (a few builtins)
    is held strongly, since there is nothing else to do with it.
    """
    if obj is None:
        return _none
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _none() -> None:
    return None
