"""huggingface_hub's adapter: its progress-bar switches, the one piece of the hub npu-port touches.

The quiet console (:mod:`npu_port.console`) keeps the hub's download bars on while it turns the libraries' loading
bars off (transformers 5 switches the hub's bars together with its own, and a long download with nothing on screen
looks like a hang). The switches are public (``huggingface_hub.utils``, documented since 0.10); a hub without them,
or one that fails to import, is declined: None, and the console leaves the bars as they are.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Callable, Optional, Tuple

#: (are_progress_bars_disabled, enable_progress_bars, disable_progress_bars)
Switches = Tuple[Callable[[], bool], Callable[[], None], Callable[[], None]]

_NAMES = ("are_progress_bars_disabled", "enable_progress_bars", "disable_progress_bars")


def progress_bar_switches() -> Optional[Switches]:
    """The hub's three progress-bar functions, or None where the hub is not installed or has no such switches."""
    try:
        if importlib.util.find_spec("huggingface_hub") is None:
            return None
        utils = importlib.import_module("huggingface_hub.utils")
    except Exception:  # noqa: BLE001 - a broken hub install: its bars are not ours to fix
        return None
    found = tuple(getattr(utils, name, None) for name in _NAMES)
    return found if all(callable(function) for function in found) else None  # type: ignore[return-value]
