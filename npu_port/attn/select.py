"""Which kernel runs a call: a forced one (checked, with reasons), or the first that can in an order.

Until a strategy is set (the strategy registry installs its own selector through :func:`set_default_selector`),
``kernel=None`` tries the kernels that declare ``default_selection``, by priority (:func:`default_order`): the Ascend
ops on NPU tensors, then SDPA, then the memory-bounded chunked kernel, then the reference. Nothing is skipped
silently: when no kernel fits, every kernel's reasons are raised together.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Union

from ..errors import KernelUnavailableError, NoKernelError
from .call import AttentionCall
from .kernels.base import Kernel
from .registry import default_order, get_kernel, kernels

Selector = Callable[[AttentionCall], Kernel]


def runnable_kernels(call: AttentionCall) -> List[str]:
    """Names of the registered kernels that can run ``call`` on this machine."""
    return [k.name for k in kernels() if not k.reasons(call)]


def first_runnable(call: AttentionCall, order: Sequence[Union[str, Kernel]]) -> Kernel:
    """The first kernel in ``order`` with no reasons; otherwise :class:`NoKernelError` with everyone's reasons."""
    for entry in order:
        kernel = get_kernel(entry)
        if not kernel.reasons(call):
            return kernel
    # only on failure: ask again and collect everyone's reasons for the message
    refusals: Dict[str, List[str]] = {get_kernel(e).name: get_kernel(e).reasons(call) for e in order}
    raise NoKernelError(call.describe(), refusals)


def _default_selector(call: AttentionCall) -> Kernel:
    return first_runnable(call, default_order())


_selector: Selector = _default_selector


def set_default_selector(selector: Optional[Selector]) -> Selector:
    """Install the function that picks a kernel when ``kernel=None`` (None restores the built-in order).

    Returns the previous selector so callers can put it back. Used by the strategy registry.
    """
    global _selector
    previous = _selector
    _selector = selector if selector is not None else _default_selector
    return previous


def current_selector() -> Selector:
    """The function that picks a kernel when ``kernel=None`` (so a caller can put it back later)."""
    return _selector


def resolve_kernel(kernel: Union[None, str, Kernel], call: AttentionCall) -> Kernel:
    """The kernel that will run ``call``: the active selector's pick, or the forced one if it can run it."""
    if kernel is None:
        return _selector(call)
    chosen = get_kernel(kernel)
    found = chosen.reasons(call)
    if found:
        raise KernelUnavailableError(chosen.name, call.describe(), found, runnable_kernels(call))
    return chosen


def __getattr__(name: str):
    if name == "DEFAULT_ORDER":  # the tuple this module once kept by hand, now derived from the registry
        return tuple(default_order())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
