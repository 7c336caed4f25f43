"""Calling back after each of the user's own modules is imported, so that classes are patched as they are defined.

Legacy attention classes live in the project's own files (``models/attention.py``); ``npu-port run`` patches each
one right after its module executes — before any instance exists — rather than hunting for instances later. Only
modules whose file is under one of the watched directories (the script's) are looked at; packages in
site-packages and the standard library are not.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from types import ModuleType
from typing import Callable, List, Optional, Sequence


class _CallbackLoader(importlib.abc.Loader):
    """The real loader, plus ``callback(module)`` once the module has executed."""

    def __init__(self, loader, callback: Callable[[ModuleType], None]):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str):  # get_code, get_source, is_package, get_filename... as the real loader
        return getattr(self._loader, name)


class ImportWatcher(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that asks the others for the spec and wraps loaders of watched files."""

    #: Finders that ask the rest of sys.meta_path skip each other (npu_port.shims.finder does): no recursion.
    delegates_to_meta_path = True

    def __init__(self, roots: Sequence[str], callback: Callable[[ModuleType], None]):
        self.roots = [os.path.realpath(root) + os.sep for root in roots]
        self.callback = callback
        self.watched: List[str] = []

    def _watched(self, origin: Optional[str]) -> bool:
        if not origin or not origin.endswith(".py"):
            return False
        real = os.path.realpath(origin)
        return any(real.startswith(root) for root in self.roots) and "site-packages" not in real

    def find_spec(self, fullname, path=None, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and self._watched(spec.origin) and hasattr(spec.loader, "exec_module"):
                spec.loader = _CallbackLoader(spec.loader, self._after)
            return spec
        return None

    def _after(self, module: ModuleType) -> None:
        self.watched.append(module.__name__)
        self.callback(module)

    def install(self) -> "ImportWatcher":
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        return self

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
