"""Lazy, honest probing of optional packages (torch_npu, xformers, flash_attn, ...).

"Installed" and "importable" are different questions: a torch_npu wheel on a machine without CANN is installed but
fails with ``libhccl.so: cannot open shared object file``. Such a package counts as absent, and the reason is kept
so that ``npu-port kernels`` and error messages can say exactly what is wrong and how to fix it. Nothing here runs
at import time; a probe happens the first time a kernel asks.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, Optional

from .reasons import Reason

#: How to get each optional package, shown when it is missing.
INSTALL_HINTS: Dict[str, str] = {
    "torch_npu": (
        'install it on an Ascend machine with CANN: pip install "npu-port[npu]" '
        "(torch-npu must match your torch version)"
    ),
    "xformers": "pip install xformers (a build matching your torch and CUDA)",
    "flash_attn": "pip install flash-attn --no-build-isolation (needs a CUDA toolkit and a matching torch)",
}

#: What usually fixes a package that is installed but fails to import.
BROKEN_HINTS: Dict[str, str] = {
    "torch_npu": (
        "source CANN's environment first (e.g. source /usr/local/Ascend/ascend-toolkit/set_env.sh) "
        "and check that torch and torch_npu have the same major.minor version"
    ),
    "xformers": "it was probably built for another torch or CUDA version; reinstall a matching build",
    "flash_attn": "it was probably built for another torch or CUDA version; reinstall a matching build",
}


@dataclass(frozen=True)
class PackageStatus:
    """The outcome of probing one optional package: the module, or the reason it cannot be used."""

    name: str
    module: Optional[ModuleType]
    reason: Optional[Reason]

    @property
    def ok(self) -> bool:
        return self.module is not None


_failures: Dict[str, PackageStatus] = {}


def probe(name: str) -> PackageStatus:
    """Import ``name`` if possible; otherwise say why not.

    A module already in ``sys.modules`` always wins (that is also how tests install stand-ins). Failures are cached
    because a failing import walks ``sys.path`` every time; :func:`forget` clears the cache.
    """
    module = sys.modules.get(name)
    if module is not None:
        return PackageStatus(name, module, None)
    cached = _failures.get(name)
    if cached is not None:
        return cached
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        status = PackageStatus(
            name,
            None,
            Reason("package-missing", f"{name} is not installed; {INSTALL_HINTS.get(name, 'pip install it')}"),
        )
    else:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # any failure inside a broken native package means "absent", never a crash
            detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
            hint = BROKEN_HINTS.get(name, "reinstall it")
            status = PackageStatus(
                name, None, Reason("package-broken", f"{name} is installed but cannot be imported ({detail}); {hint}")
            )
        else:
            return PackageStatus(name, module, None)
    _failures[name] = status
    return status


def forget(name: Optional[str] = None) -> None:
    """Drop cached failures (all, or one package) so the next probe looks again, e.g. after installing it."""
    if name is None:
        _failures.clear()
    else:
        _failures.pop(name, None)
