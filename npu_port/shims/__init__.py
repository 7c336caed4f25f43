"""Deprecated: ``npu_port.shims`` was split into :mod:`npu_port.dropins` (the flash_attn / xformers drop-ins and the
import hook that serves them) and :mod:`npu_port.fallbacks` (compiled-extension fallbacks, safe math).

The old module paths keep importing for one release, each with a :class:`DeprecationWarning` that names its new
place. An old path gives the new module object itself (``sys.modules`` holds it under both names), so state such as
the registered stand-ins is shared and nothing is loaded twice. The old paths are served by a small import hook
rather than stub files, so that git sees each module as moved (edits made to an old path elsewhere follow the move).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

#: Old submodule of ``npu_port.shims`` -> the module that replaces it.
MOVED = {
    "_attention": "npu_port.dropins._attention",
    "alt_cuda_corr": "npu_port.fallbacks.alt_cuda_corr",
    "dropins": "npu_port.dropins.install",
    "fallbacks": "npu_port.fallbacks.registry",
    "finder": "npu_port.dropins.finder",
    "flash_attn_bert_padding": "npu_port.dropins.flash_attn_bert_padding",
    "flash_attn_impl": "npu_port.dropins.flash_attn_impl",
    "safe_math": "npu_port.fallbacks.safe_math",
    "xformers_attn_bias_impl": "npu_port.dropins.xformers_attn_bias_impl",
    "xformers_fmha_impl": "npu_port.dropins.xformers_fmha_impl",
    "xformers_impl": "npu_port.dropins.xformers_impl",
    "xformers_ops_impl": "npu_port.dropins.xformers_ops_impl",
}

warnings.warn(
    "npu_port.shims is deprecated; use npu_port.dropins (flash_attn / xformers drop-ins, the import hook) or "
    "npu_port.fallbacks (compiled-extension fallbacks, safe math)",
    DeprecationWarning,
    stacklevel=2,
)


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import npu_port.shims.<old>`` for the names in :data:`MOVED`, and nothing else."""

    npu_port_old_shims_paths = True

    def find_spec(self, fullname: str, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None  # a placeholder, swapped for the new module in exec_module

    def exec_module(self, module: ModuleType) -> None:
        new_name = MOVED[module.__name__.rpartition(".")[2]]
        warnings.warn(f"{module.__name__} is deprecated; use {new_name}", DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(new_name)  # what the import statement returns


if not any(getattr(finder, "npu_port_old_shims_paths", False) for finder in sys.meta_path):
    sys.meta_path.append(_OldPaths())
