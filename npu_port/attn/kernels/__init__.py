"""The built-in attention kernels; importing this package registers them.

Each kernel is one module with one job; none imports its optional package at import time. Every public module here
is imported (and so registered) by the loop below, and where a kernel stands among the others (its priority, whether
the default selection tries it, its place in listings, which strategy options set which of its options) is declared
on its class: every list of kernels is derived from the registry (:mod:`npu_port.attn.registry`), so a new built-in
kernel is one new module in this package and nothing else.
"""

import importlib
import pkgutil

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    if not _module.startswith("_") and _module != "base":
        importlib.import_module(f"{__name__}.{_module}")
