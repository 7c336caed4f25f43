"""Process-wide effects of a strategy applied with ``target=None``, and their exact undoing.

Three things change: environment variables (for child processes, and for libraries imported later — diffusers
reads ``DIFFUSERS_ATTN_BACKEND`` once, at import), diffusers' active dispatcher backend when diffusers is already
imported (the runtime equivalent of the variable, after diffusers' own requirement check), and the kernel picked
by ``npu_port.attention(kernel=None)``. Handles may be restored in any order: the state is always recomputed as
"the originals, overlaid by the still-active handles in the order they were applied", so restoring the last one
gives back exactly what was there before.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict, List, Optional

from ..attn import select as kernel_select
from ..upstream.diffusers import dispatch

DIFFUSERS_BACKEND_VARIABLE = "DIFFUSERS_ATTN_BACKEND"
#: Variables only read when a program or torch_npu starts: set for child processes, and said so.
READ_AT_START = {
    "DIFFUSERS_ATTENTION_TYPE": "older NPU scripts read it when they start",
    "TASK_QUEUE_ENABLE": "torch_npu reads it when it initialises",
    "PYTORCH_NPU_ALLOC_CONF": "torch_npu reads it when it initialises",
}
_UNSET = object()


class StrategyNotAppliedWarning(UserWarning):
    """Part of a strategy could not take effect in the running process (it still applies to child processes)."""


class ProcessState:
    def __init__(self) -> None:
        self.active: List[Any] = []  # handles, in the order they were applied
        self.original_env: Dict[str, Optional[str]] = {}
        self.original_backend: Any = _UNSET
        self.original_selector: Optional[kernel_select.Selector] = None
        self.declined: List[Any] = []  # upstream declines met by the last _sync (npu_port.upstream.Decline)

    # ---- the diffusers dispatcher -------------------------------------------------------------------------------

    def _set_diffusers_backend(self, value: Optional[str]) -> Optional[str]:
        """Make diffusers' active backend ``value`` (None = the original) when diffusers is imported; a note when it
        could not be done (diffusers refused the backend). Missing dispatcher pieces decline: kept in
        ``self.declined`` (the handle reports it) and warned about once, the registry left as it is. A release older
        than the dispatcher has no backend to choose: nothing to do, nothing to warn about."""
        if not dispatch.loaded() or not dispatch.in_this_release():
            return None
        if value is None:
            if self.original_backend is not _UNSET and dispatch.decline_process_wide() is None:
                dispatch.set_active_backend(self.original_backend)
            return None
        decline = dispatch.decline_process_wide()
        if decline is not None:
            self.declined.append(decline)
            return None
        if self.original_backend is _UNSET:
            self.original_backend = dispatch.active_backend()
        try:
            backend = dispatch.usable_backend(value)
        except (ValueError, RuntimeError, ImportError) as exc:
            variable = f"{DIFFUSERS_BACKEND_VARIABLE}={value}"
            return f"{variable}: diffusers is already imported and refused it at run time ({exc})"
        dispatch.set_active_backend(backend)
        return None

    # ---- applying -----------------------------------------------------------------------------------------------

    def activate(self, handle: Any) -> List[str]:
        """Apply ``handle``'s process-wide effects; returns notes on what did not take effect in this process."""
        if not self.active:
            self.original_selector = kernel_select.current_selector()
        for key in handle.strategy.env:
            self.original_env.setdefault(key, os.environ.get(key))
        self.active.append(handle)
        refused = self._sync()
        for note in refused:  # something the user asked for did not happen in this process: say so loudly
            warnings.warn(note, StrategyNotAppliedWarning, stacklevel=3)
        notes = list(refused)
        handle.declines = list(self.declined)  # warned about once per process by the adapter; listed on every handle
        notes += [f"not applied in this process: {decline}" for decline in self.declined]
        for key, value in handle.strategy.env.items():
            if key == "DIFFUSERS_ATTENTION_TYPE" or (key in READ_AT_START and "torch_npu" in sys.modules):
                notes.append(f"{key}={value} is set for child processes only: {READ_AT_START[key]}")
        if DIFFUSERS_BACKEND_VARIABLE in handle.strategy.env:
            notes.append(
                f"{DIFFUSERS_BACKEND_VARIABLE} reaches diffusers' dispatcher-based models (Flux, ...); models whose "
                "processors call SDPA directly (AttnProcessor2_0: UNet, VAE, DiT) ignore it — pass target=model"
            )
        return notes

    def deactivate(self, handle: Any) -> None:
        if handle in self.active:
            self.active.remove(handle)
            self._sync()
            if not self.active:  # everything is back: forget the originals, so the next apply reads them afresh
                self.original_env.clear()
                self.original_backend = _UNSET

    def _sync(self) -> List[str]:
        notes: List[str] = []
        self.declined = []
        for key, original in self.original_env.items():
            value = original
            for handle in self.active:
                if key in handle.strategy.env:
                    value = handle.strategy.env[key]
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        wanted: Optional[str] = None
        for handle in self.active:
            wanted = handle.strategy.env.get(DIFFUSERS_BACKEND_VARIABLE, wanted)
        note = self._set_diffusers_backend(wanted)
        if note:  # the registry was left as it was
            notes.append(note)
        if self.active:
            kernel_select.set_default_selector(self.active[-1].router.select)
        else:
            kernel_select.set_default_selector(self.original_selector)
        return notes


STATE = ProcessState()


def active_strategy() -> Any:
    """The process-wide strategy in force (the last one applied and not yet restored), or None."""
    return STATE.active[-1].strategy if STATE.active else None
