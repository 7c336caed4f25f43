"""An import hook that serves npu-port's stand-in for a package when the real one is missing or broken.

A CUDA project's ``import flash_attn`` or ``import alt_cuda_corr`` fails on an NPU or a CPU. Registered here, the
name resolves through a ``sys.meta_path`` finder to a module with a proper ``ModuleSpec`` (so
``importlib.util.find_spec`` answers), and — for drop-ins of distributions — package metadata (so
``importlib.metadata.version("flash-attn")`` and the availability checks of diffusers and transformers work).

When each one is used (``mode``):

- ``"missing"`` — only when no real package can be found (drop-ins: a real, installed flash_attn always wins);
- ``"broken"`` — also when the real module is found but fails to load (a compiled extension built for another
  torch or CUDA: the failure is logged and the fallback is served instead);
- ``"always"`` — even when a real one works (the user forces the stand-in).

A folder of the module's name without ``__init__.py`` is no real module: Python would import it as an empty namespace
package. RAFT's ``alt_cuda_corr/`` is one (the extension's ``.cu`` / ``.cpp`` sources and its ``setup.py``, sitting
on ``sys.path`` unbuilt). It counts as missing, and the reason given is that it is not built — said when the project
imports the name, never for a look-up alone.

Everything is undone by :func:`uninstall`: the finder leaves ``sys.meta_path`` and the modules it created leave
``sys.modules``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Dict, Iterable, List, Optional

from ..hits import HitLog

#: The logger that reports a real module failing to load. Its name predates the split of ``npu_port.shims`` into
#: :mod:`npu_port.dropins` and :mod:`npu_port.fallbacks` and is kept: it is documented, and logging set-ups name it.
LOGGER_NAME = "npu_port.shims"
logger = logging.getLogger(LOGGER_NAME)

MODES = ("missing", "broken", "always")


@dataclass
class Replacement:
    """``name`` (a top-level module) served by the modules in ``modules`` ({full name: npu-port module path})."""

    name: str
    modules: Dict[str, str]
    mode: str = "missing"
    distribution: Optional[str] = None  # package metadata to present, e.g. "flash-attn"
    version: Optional[str] = None
    served: List[str] = field(default_factory=list)  # full names actually served, for the run summary
    reason: Optional[str] = None  # why the stand-in is in use ("not installed", "not built (...)", the import's error)
    # Records of one registration, never copied: ``dataclasses.replace(template, ...)`` gives a fresh, empty one.
    imported_by: Dict[str, str] = field(default_factory=dict, init=False)  # full name -> the importing module
    log: HitLog = field(default_factory=HitLog, init=False)  # each full name served, with the line that imported it


_lock = threading.RLock()
_registry: Dict[str, Replacement] = {}


class _StandInLoader(importlib.abc.Loader):
    """Creates ``fullname`` as a fresh module and fills it from the npu-port module that implements it; ``unbuilt``
    (why the real one does not count, see :func:`_unbuilt`) becomes the reason, logged once, when it is imported."""

    #: How :func:`npu_port._optional.probe` tells a stand-in's spec from the real package's without importing it.
    npu_port_stand_in = True

    def __init__(self, replacement: Replacement, fullname: str, unbuilt: Optional[str] = None):
        self.replacement = replacement
        self.fullname = fullname
        self.unbuilt = unbuilt

    def create_module(self, spec):
        return None  # the default: a fresh module named spec.name

    def exec_module(self, module: ModuleType) -> None:
        if self.unbuilt is not None and self.replacement.reason != self.unbuilt:
            self.replacement.reason = self.unbuilt
            logger.warning("npu-port: %s is %s; using npu-port's fallback", self.fullname, self.unbuilt)
        implementation = importlib.import_module(self.replacement.modules[self.fullname])
        public = {k: v for k, v in vars(implementation).items() if not (k.startswith("__") and k.endswith("__"))}
        module.__dict__.update(public)
        module.__doc__ = implementation.__doc__
        module.__npu_port_stand_in__ = self.replacement.modules[self.fullname]
        if self.fullname == self.replacement.name and self.replacement.version is not None:
            module.__version__ = self.replacement.version  # `pkg.__version__` checks are common
        self.replacement.served.append(self.fullname)
        self.replacement.imported_by.setdefault(self.fullname, _importer())
        self.replacement.log.hit(self.fullname)


class _RealOrFallbackLoader(importlib.abc.Loader):
    """Loads the real module; if that raises, logs why and serves the stand-in in its place (mode "broken")."""

    def __init__(self, replacement: Replacement, fullname: str, real_spec):
        self.replacement = replacement
        self.fullname = fullname
        self.real_spec = real_spec
        self.failed: Optional[BaseException] = None

    def create_module(self, spec):
        real_loader = self.real_spec.loader
        try:
            return real_loader.create_module(self.real_spec) if hasattr(real_loader, "create_module") else None
        except Exception as exc:  # a compiled extension that cannot load (undefined symbol, missing libcudart...)
            self.failed = exc
            return None

    def exec_module(self, module: ModuleType) -> None:
        if self.failed is None:
            try:
                self.real_spec.loader.exec_module(module)
                return
            except Exception as exc:
                self.failed = exc
        detail = f"{type(self.failed).__name__}: {self.failed}".strip().splitlines()[0]
        self.replacement.reason = f"the real module failed to load ({detail})"
        logger.warning("npu-port: %s failed to load (%s); using npu-port's fallback", self.fullname, detail)
        _StandInLoader(self.replacement, self.fullname).exec_module(module)


#: Module-name prefixes of the frames :func:`_importer` looks past: the import system and npu-port's stand-ins.
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib", "npu_port.dropins", "npu_port.fallbacks", "npu_port.shims")


def _importer() -> str:
    """The module whose code is importing right now: the first frame outside the import system and npu-port's
    stand-ins (so the summary can say "xformers, imported by diffusers.models.attention_processor")."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_IMPORT_MACHINERY):
            return name or "?"
        frame = frame.f_back
    return "?"


def _real_spec(fullname: str, path, target) -> Optional[importlib.machinery.ModuleSpec]:
    """The spec the rest of ``sys.meta_path`` would give (the real package), or None."""
    for finder in sys.meta_path:
        if getattr(finder, "delegates_to_meta_path", False) or not hasattr(finder, "find_spec"):
            continue  # this finder, and others that ask the rest of sys.meta_path themselves (no recursion)
        try:
            spec = finder.find_spec(fullname, path, target)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            return spec
    return None


#: What a folder holding a compiled extension's unbuilt sources has in it.
_SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp")
_BUILD_FILES = ("setup.py", "pyproject.toml", "CMakeLists.txt")
#: The loader a namespace package's spec may carry (public from Python 3.11; before, its spec has none).
_NAMESPACE_LOADER = getattr(importlib.machinery, "NamespaceLoader", type(None))


def _unbuilt(spec: Optional[importlib.machinery.ModuleSpec]) -> Optional[str]:
    """Why ``spec`` is no real module — a namespace package: folders without ``__init__.py``, found only because no
    module of that name is anywhere on the path — as the reason to give (``"not built (/p/alt_cuda_corr holds its
    unbuilt sources)"``); None for a real module or none at all."""
    if spec is None or spec.submodule_search_locations is None:
        return None
    if spec.loader is not None and not isinstance(spec.loader, _NAMESPACE_LOADER):
        return None
    try:
        folders = list(spec.submodule_search_locations)
    except (KeyError, AttributeError):  # a nested namespace __path__ that wants its parent imported
        folders = []
    where = ", ".join(folders) or "a folder"
    if any(_has_sources(folder) for folder in folders):
        return f"not built ({where} holds its unbuilt sources)"
    return f"not built ({where} has no __init__.py and no compiled module)"


def _has_sources(folder: str) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(name in _BUILD_FILES or name.endswith(_SOURCE_SUFFIXES) for name in names)


class _Metadata(importlib.metadata.Distribution):
    """Package metadata for a served drop-in: name and version, as ``importlib.metadata`` reads them."""

    def __init__(self, replacement: Replacement):
        self.replacement = replacement

    def read_text(self, filename: str) -> Optional[str]:
        if filename == "METADATA":
            return (
                f"Metadata-Version: 2.1\nName: {self.replacement.distribution}\nVersion: {self.replacement.version}\n"
                f"Summary: npu-port stand-in for {self.replacement.distribution}\n"
            )
        if filename == "top_level.txt":
            return f"{self.replacement.name}\n"
        return None

    def locate_file(self, path):
        return path


class StandInFinder(importlib.abc.MetaPathFinder):
    """The one ``sys.meta_path`` entry that serves every registered replacement."""

    delegates_to_meta_path = True

    def find_spec(self, fullname: str, path=None, target=None):
        replacement = _registry.get(fullname.partition(".")[0])
        if replacement is None or fullname not in replacement.modules:
            return None
        is_package = any(name.startswith(fullname + ".") for name in replacement.modules)
        unbuilt = None
        if replacement.mode != "always":
            real = _real_spec(fullname, path, target)
            unbuilt = _unbuilt(real)
            if real is not None and unbuilt is None:
                if replacement.mode == "missing":
                    return None  # a real package is there: it wins
                loader = _RealOrFallbackLoader(replacement, fullname, real)
                spec = importlib.machinery.ModuleSpec(fullname, loader, origin=real.origin, is_package=is_package)
                spec.has_location = real.has_location
                if is_package:
                    spec.submodule_search_locations = list(real.submodule_search_locations or [])
                return spec
            if unbuilt is None:
                replacement.reason = replacement.reason or "not installed"
        origin = f"npu-port stand-in ({replacement.modules[fullname]})"
        spec = importlib.machinery.ModuleSpec(
            fullname, _StandInLoader(replacement, fullname, unbuilt), origin=origin, is_package=is_package
        )
        if is_package:
            spec.submodule_search_locations = []
        return spec

    def find_distributions(self, context=None) -> Iterable:
        wanted = context.name if context is not None else None
        for replacement in list(_registry.values()):
            if replacement.distribution is None or not self._presented(replacement):
                continue
            names = {replacement.distribution, replacement.distribution.replace("-", "_"), replacement.name}
            if wanted is None or _normalise(wanted) in {_normalise(n) for n in names}:
                yield _Metadata(replacement)

    @staticmethod
    def _presented(replacement: Replacement) -> bool:
        """Metadata is shown only where the stand-in is what ``import`` gives (no real distribution to shadow)."""
        if replacement.mode == "always":
            return True
        real = _real_spec(replacement.name, None, None)
        return real is None or _unbuilt(real) is not None


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


_finder = StandInFinder()


def register(replacement: Replacement) -> Replacement:
    """Serve ``replacement`` from now on (installs the finder on first use); replaces an earlier registration."""
    if replacement.mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {replacement.mode!r}")
    if replacement.name not in replacement.modules:
        raise ValueError(f"modules must include the top-level module {replacement.name!r}")
    with _lock:
        _registry[replacement.name] = replacement
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        importlib.invalidate_caches()
    return replacement


def unregister(name: str) -> None:
    """Stop serving ``name`` and drop the modules the stand-in created (the real package imports afresh after)."""
    with _lock:
        replacement = _registry.pop(name, None)
        if replacement is not None:
            for fullname in list(sys.modules):
                module = sys.modules[fullname]
                if fullname.partition(".")[0] == name and getattr(module, "__npu_port_stand_in__", None):
                    del sys.modules[fullname]
        if not _registry and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def uninstall() -> None:
    """Undo every registration."""
    for name in list(_registry):
        unregister(name)


def registered() -> Dict[str, Replacement]:
    return dict(_registry)
