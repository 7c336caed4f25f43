"""Calling back after each of the user's own modules is imported, so that classes are patched as they are defined —
and, optionally, compiling those modules through a transform (the device-type checks of ``npu-port run``).

Legacy attention classes live in the project's own files (``models/attention.py``); ``npu-port run`` patches each
one right after its module executes — before any instance exists — rather than hunting for instances later. Only
modules whose file is under one of the watched directories (the project's) are looked at; installed packages
(``site-packages``, ``dist-packages``), the standard library and npu-port itself never are, even when they sit
under a watched directory (a virtual env inside the project folder). Modules named in ``names`` (the targets of
``--override``) are called back wherever they live, but never transformed.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import sysconfig
import threading
from types import CodeType, ModuleType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

#: ``transform(source, filename, module_name)`` -> (code, globals to set before it runs), or None to load as usual.
Transform = Callable[[str, str, str], Optional[Tuple[CodeType, Dict[str, Any]]]]

_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
#: Watchers resolving a name on this thread: each asks the rest of sys.meta_path (other watchers included, so their
#: wrappers chain) and answers None to a nested question about a name it is already resolving.
_resolving = threading.local()


def _never_watched() -> Tuple[str, ...]:
    """Folders whose modules are never the project's: the standard library and npu-port's own package."""
    paths = sysconfig.get_paths()
    found = {paths[key] for key in ("stdlib", "platstdlib") if paths.get(key)}
    found.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # npu_port/
    return tuple(os.path.realpath(p) + os.sep for p in found)


class _CallbackLoader(importlib.abc.Loader):
    """The real loader, plus ``callback(module)`` once the module has executed, and the transform if any."""

    def __init__(self, loader, callback: Callable[[ModuleType], None], transform: Optional[Transform] = None):
        self._loader = loader
        self._callback = callback
        self._transform = transform

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def _transformed(self, fullname: str) -> Optional[Tuple[CodeType, Dict[str, Any]]]:
        if self._transform is None:
            return None
        try:
            source = self._loader.get_source(fullname)
            filename = self._loader.get_filename(fullname)
        except (AttributeError, ImportError, OSError):
            return None
        return None if source is None else self._transform(source, filename, fullname)

    def get_code(self, fullname: str):
        """The transformed code (``runpy`` — ``npu-port run -m`` — runs a module from this), else the real one."""
        transformed = self._transformed(fullname)
        return transformed[0] if transformed is not None else self._loader.get_code(fullname)

    def exec_module(self, module: ModuleType) -> None:
        transformed = self._transformed(module.__name__)
        if transformed is None:
            self._loader.exec_module(module)
        else:
            code, extra = transformed
            module.__dict__.update(extra)
            exec(code, module.__dict__)
        self._callback(module)

    def __getattr__(self, name: str):  # get_source, is_package, get_filename... as the real loader
        return getattr(self._loader, name)


class ImportWatcher(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that asks the others for the spec and wraps loaders of watched files."""

    #: npu_port.dropins.finder's real-package lookup skips finders that ask the rest of sys.meta_path (no recursion).
    delegates_to_meta_path = True

    def __init__(
        self,
        roots: Sequence[str],
        callback: Callable[[ModuleType], None],
        *,
        transform: Optional[Transform] = None,
        names: Iterable[str] = (),
    ):
        self.roots = [os.path.realpath(root) + os.sep for root in roots]
        self.callback = callback
        self.transform = transform
        self.names = frozenset(names)
        self.watched: List[str] = []  # the project's modules, in import order
        self._never = _never_watched()

    def is_project_file(self, origin: Optional[str]) -> bool:
        """Whether a module file is the project's own: a ``.py`` under a root, not installed, not stdlib/npu-port."""
        if not origin or not origin.endswith(".py"):
            return False
        real = os.path.realpath(origin)
        if any(marker in real for marker in _INSTALLED) or real.startswith(self._never):
            return False
        return any(real.startswith(root) for root in self.roots)

    def find_spec(self, fullname, path=None, target=None):
        active = getattr(_resolving, "active", None)
        if active is None:
            active = _resolving.active = set()
        key = (id(self), fullname)
        if key in active:
            return None
        active.add(key)
        try:
            spec = self._spec_from_the_others(fullname, path, target)
        finally:
            active.discard(key)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            if self.is_project_file(spec.origin):
                spec.loader = _CallbackLoader(spec.loader, self._after, self.transform)
            elif fullname in self.names:
                spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec

    def _spec_from_the_others(self, fullname, path, target):
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
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
