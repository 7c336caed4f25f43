"""Lazy, honest probing of optional packages (torch_npu, xformers, flash_attn, ...).

"Installed" and "importable" are different questions: a torch_npu wheel on a machine without CANN is installed but
fails with ``libhccl.so: cannot open shared object file``. Such a package counts as absent, and the reason is kept
so that ``npu-port kernels`` and error messages can say exactly what is wrong and how to fix it. Nothing here runs
at import time; a probe happens the first time a kernel asks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional
from urllib.parse import unquote, urlparse

from .reasons import Reason

#: What each extra of setup.cfg installs, for when the distribution's metadata cannot be read (a source tree on
#: sys.path). tests/project/test_packaging.py checks this against setup.cfg.
EXTRAS: Dict[str, List[str]] = {
    "npu": ["torch-npu"],
    "diffusers": ["diffusers>=0.11.1", "transformers>=4.25.1"],
    "demo": ["gradio>=5.0"],
    "bench": ["matplotlib>=3.5"],
    "fix": ["libcst>=1.1"],
    "video": ["imageio", "imageio-ffmpeg"],
}


def _checkout() -> Optional[Path]:
    """The source tree this package is imported from (a folder with ``setup.cfg`` beside ``npu_port/``), or None
    (an installed wheel: ``site-packages`` has no ``setup.cfg``)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "setup.cfg").is_file() and (root / "npu_port").is_dir() else None


@functools.lru_cache(maxsize=None)
def _installed_from() -> Optional[str]:
    """How npu-port itself was installed, as the pip argument that installs it again with an extra (``{extra}``).

    npu-port is not on the package index, so naming the extra on the bare project name would fail: the hint must
    name the checkout it came from. PEP 610's ``direct_url.json`` says where (``pip install -e DIR`` or
    ``pip install DIR``). Without it — a source tree imported from ``sys.path``, or one whose ``npu_port.egg-info``
    shadows the installed metadata because the working directory is on ``sys.path`` — the source tree this module
    runs from is its own checkout. None when neither is known (a wheel built elsewhere): then only the packages
    themselves are named.
    """
    from importlib import metadata

    try:
        text = metadata.distribution("npu-port").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        text = None
    if text:
        try:
            info = json.loads(text)
            url = urlparse(info["url"])
        except (ValueError, KeyError, TypeError):
            url = None
        if url is not None and url.scheme == "file":
            where = unquote(url.path)
            editable = bool((info.get("dir_info") or {}).get("editable"))
            return f'pip install {"-e " if editable else ""}"{_display(where)}[{{extra}}]"'
    checkout = _checkout()
    return f'pip install -e "{_display(str(checkout))}[{{extra}}]"' if checkout is not None else None


def _display(path: str) -> str:
    """``path`` as the user would type it: ``.`` for the working directory, relative when inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return relative if not relative.startswith("..") else path


def extra_hint(extra: str) -> str:
    """The command that installs npu-port's ``extra`` the way npu-port itself was installed, or its packages.

    >>> extra_hint("demo")  # from a checkout installed with pip install -e .   # doctest: +SKIP
    'pip install -e ".[demo]" (or: pip install "gradio>=5.0")'
    """
    packages = " ".join(f'"{p}"' if any(c in p for c in "<>=!~") else p for p in EXTRAS.get(extra, []))
    how = _installed_from()
    if how is None:
        return f"pip install {packages}" if packages else f"install npu-port's {extra!r} extra"
    command = how.format(extra=extra)
    return f"{command} (or: pip install {packages})" if packages else command


#: How to get each optional package, shown when it is missing.
INSTALL_HINTS: Dict[str, str] = {
    "torch_npu": (
        "install it on an Ascend machine with CANN: pip install torch-npu "
        "(torch-npu must match your torch version: the same major.minor)"
    ),
    "xformers": "pip install xformers (a build matching your torch and CUDA)",
    "flash_attn": "pip install flash-attn --no-build-isolation (needs a CUDA toolkit and a matching torch)",
    "flash_attn_npu": (
        "pip install flash-attn-npu --no-build-isolation on an Ascend 910B / 910C machine (needs CANN >= 8.5.0 and "
        "torch_npu matching torch)"
    ),
}

#: What usually fixes a package that is installed but fails to import.
BROKEN_HINTS: Dict[str, str] = {
    "torch_npu": (
        "source CANN's environment first (e.g. source /usr/local/Ascend/ascend-toolkit/set_env.sh) "
        "and check that torch and torch_npu have the same major.minor version"
    ),
    "xformers": "it was probably built for another torch or CUDA version; reinstall a matching build",
    "flash_attn": "it was probably built for another torch or CUDA version; reinstall a matching build",
    "flash_attn_npu": (
        'its flash-attn 2 API imports only on Ascend 910B / 910C ("Unsupported Ascend device" elsewhere), after '
        "torch_npu imports (source CANN's set_env.sh first); otherwise rebuild it for this torch_npu and CANN"
    ),
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

    npu-port's own stand-ins (the flash_attn / xformers drop-ins that ``npu-port run`` serves) are not the package:
    a kernel must not compute through the drop-in that computes through it, and asking must not import one — the
    run summary lists a stand-in as served only when the project imported it.
    """
    module = sys.modules.get(name)
    if module is not None:
        if getattr(module, "__npu_port_stand_in__", None):
            return _stand_in_status(name)
        return PackageStatus(name, module, None)
    cached = _failures.get(name)
    if cached is not None:
        return cached
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and getattr(spec.loader, "npu_port_stand_in", False):
        return _stand_in_status(name)  # not cached: the stand-in goes when npu-port run ends
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


def installed_version(*distributions: str) -> Optional[str]:
    """The version of the first of ``distributions`` that is installed, from its metadata, without importing it
    (``torch-npu`` and ``torch_npu`` alike), or None when none is: the one place npu-port reads versions."""
    from importlib import metadata

    for distribution in distributions:
        for name in dict.fromkeys((distribution, distribution.replace("_", "-"), distribution.replace("-", "_"))):
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
    return None


def _stand_in_status(name: str) -> PackageStatus:
    return PackageStatus(
        name,
        None,
        Reason(
            "package-missing",
            f"{name} is not installed (npu-port's stand-in serves `import {name}` during npu-port run, and computes "
            f"through npu-port's own kernels); {INSTALL_HINTS.get(name, 'pip install it')}",
        ),
    )


def forget(name: Optional[str] = None) -> None:
    """Drop cached failures (all, or one package) so the next probe looks again, e.g. after installing it."""
    if name is None:
        _failures.clear()
    else:
        _failures.pop(name, None)
