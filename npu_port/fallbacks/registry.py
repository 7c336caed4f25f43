"""Pure-PyTorch fallbacks for compiled CUDA extensions: ``import alt_cuda_corr`` works where the extension cannot.

A CUDA project builds its kernels with ``setup.py`` + ``.cu`` and imports them; on an NPU or a CPU that import fails
— the module is missing, or it is there and dies with ``undefined symbol`` / ``libcudart.so`` errors. Registered
here, the name is served by the import hook (:mod:`npu_port.dropins.finder`) from a replacement written in PyTorch.

By default (mode ``"broken"``) a real extension that loads always wins; one that is missing or fails to load is
replaced, and the failure is logged. ``"missing"`` replaces only a missing module; ``"always"`` replaces even a
working one.

A replacement is a dotted module path, a module object, or a mapping of names to callables. The finder imports
replacements by module path, so objects are kept under private names in ``sys.modules``
(``npu_port.fallbacks._fallback_modules.<name>``) for as long as they are registered.

Built in (:data:`BUILTIN_FALLBACKS`): RAFT's ``alt_cuda_corr`` (and ``raft_alt_cuda_corr``, its name in RAFT's
packaged layout), served by :mod:`npu_port.fallbacks.alt_cuda_corr`.
"""

from __future__ import annotations

import importlib
import importlib.util
import keyword
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, List, Optional, Union

from ..dropins.finder import MODES, Replacement, register, registered, unregister
from ..errors import FallbackError

#: Built-in fallbacks: extension module name -> the npu-port module that implements it.
BUILTIN_FALLBACKS: Dict[str, str] = {
    "alt_cuda_corr": "npu_port.fallbacks.alt_cuda_corr",
    "raft_alt_cuda_corr": "npu_port.fallbacks.alt_cuda_corr",
}

#: Where replacement objects (modules, mappings) live while registered, so the finder can import them by path.
OBJECTS_PACKAGE = "npu_port.fallbacks._fallback_modules"

_VALID_FORMS = "a dotted module path (str), a module object, or a mapping of names to callables"

_lock = threading.RLock()
_handles: Dict[str, "FallbackHandle"] = {}


@dataclass(eq=False)
class FallbackHandle:
    """One registered fallback. ``restore()`` (or leaving the ``with`` block) unregisters it; safe to call twice."""

    name: str
    implementation: str  # the module path the finder serves it from
    mode: str
    builtin: bool = False
    _replacement: Optional[Replacement] = None

    @property
    def served(self) -> bool:
        """Whether ``import <name>`` has been answered by the fallback."""
        return bool(self._replacement is not None and self._replacement.served)

    @property
    def reason(self) -> Optional[str]:
        """Why the fallback was served ("not installed", "not built (FOLDER holds its unbuilt sources)", or the real
        module's import error)."""
        return self._replacement.reason if self._replacement is not None else None

    @property
    def active(self) -> bool:
        return _handles.get(self.name) is self

    def restore(self) -> None:
        with _lock:
            if self.active:
                _remove(self)

    def __enter__(self) -> "FallbackHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def register_fallback(
    module_name: str, replacement: Union[str, ModuleType, Mapping], *, mode: str = "broken"
) -> FallbackHandle:
    """Serve ``module_name`` (a top-level module, like ``"alt_cuda_corr"``) from ``replacement``.

    ``replacement``: a dotted module path, a module object, or a mapping of names to callables. ``mode``:
    ``"broken"`` (default: a real module that loads wins; a missing or failing one is replaced and the failure
    logged), ``"missing"``, or ``"always"``. Registering a name again replaces the earlier fallback. Modules already
    imported stay as they are: the fallback answers the next import.
    """
    return _register(module_name, replacement, mode, builtin=False)


def unregister_fallback(module_name: str) -> None:
    """Stop serving ``module_name``; a module the fallback created leaves ``sys.modules`` (a real one stays)."""
    with _lock:
        handle = _handles.get(module_name)
        if handle is None:
            known = ", ".join(sorted(_handles)) or "none"
            raise FallbackError(f"no fallback is registered for {module_name!r}; registered fallbacks: {known}")
        _remove(handle)


def registered_fallbacks() -> Dict[str, FallbackHandle]:
    """The registered fallbacks, by module name."""
    return dict(_handles)


def install_builtin_fallbacks(mode: str = "broken") -> List[str]:
    """Register :data:`BUILTIN_FALLBACKS` (a fallback the user registered for the same name is kept); returns the
    names now served by a built-in."""
    installed = []
    with _lock:
        for name, implementation in BUILTIN_FALLBACKS.items():
            current = _handles.get(name)
            if current is not None and not current.builtin:
                continue
            _register(name, implementation, mode, builtin=True)
            installed.append(name)
    return installed


def uninstall_builtin_fallbacks() -> None:
    """Unregister the built-in fallbacks (user-registered ones stay); safe to call when none are installed."""
    with _lock:
        for name in BUILTIN_FALLBACKS:
            handle = _handles.get(name)
            if handle is not None and handle.builtin:
                _remove(handle)


def _register(module_name, replacement, mode, *, builtin: bool) -> FallbackHandle:
    _check_name(module_name)
    if mode not in MODES:
        raise FallbackError(f"fallback mode must be one of {', '.join(MODES)}; got {mode!r}")
    with _lock:
        if module_name in registered() and module_name not in _handles:
            raise FallbackError(
                f"{module_name!r} is already served by another npu-port stand-in (a drop-in); "
                "uninstall it before registering a fallback for that name"
            )
        implementation = _implementation_path(module_name, replacement)
        previous = _handles.get(module_name)
        if previous is not None:
            _remove(previous, keep=implementation)
        handle = FallbackHandle(module_name, implementation, mode, builtin)
        handle._replacement = register(Replacement(module_name, {module_name: implementation}, mode=mode))
        _handles[module_name] = handle
        return handle


def _remove(handle: FallbackHandle, keep: Optional[str] = None) -> None:
    """Unregister ``handle`` and drop the private module of an object replacement (unless ``keep`` is its path)."""
    del _handles[handle.name]
    unregister(handle.name)
    if handle.implementation.startswith(OBJECTS_PACKAGE + ".") and handle.implementation != keep:
        sys.modules.pop(handle.implementation, None)


def _check_name(module_name) -> None:
    if not isinstance(module_name, str):
        raise FallbackError(
            f"module_name must be the name a project imports, as a str (like 'alt_cuda_corr'); "
            f"got {type(module_name).__name__}"
        )
    if not _is_dotted_name(module_name):
        raise FallbackError(
            f"module_name {module_name!r} is not a module name; give the top-level name a project imports, "
            "like 'alt_cuda_corr'"
        )
    if "." in module_name:
        raise FallbackError(
            f"module_name {module_name!r} is a submodule; fallbacks are registered for top-level modules "
            "(like 'alt_cuda_corr'), which is how setup.py-built CUDA extensions are imported"
        )
    if module_name == "npu_port":
        raise FallbackError("module_name 'npu_port' is npu-port itself and cannot be replaced")


def _is_dotted_name(text: str) -> bool:
    return bool(text) and all(part.isidentifier() and not keyword.iskeyword(part) for part in text.split("."))


def _implementation_path(module_name: str, replacement) -> str:
    """The importable module path the finder will serve ``module_name`` from."""
    if isinstance(replacement, str):
        if not _is_dotted_name(replacement):
            raise FallbackError(f"replacement {replacement!r} is not a dotted module path (like 'mypkg.corr_torch')")
        top = replacement.partition(".")[0]
        if top == module_name:
            raise FallbackError(
                f"replacement {replacement!r} is inside {module_name!r} itself; give a module of your own"
            )
        try:
            found = importlib.util.find_spec(replacement)
        except (ImportError, ValueError) as exc:
            found, detail = None, f" ({type(exc).__name__}: {exc})"
        else:
            detail = ""
        if found is None:
            raise FallbackError(f"replacement module {replacement!r} cannot be found{detail}")
        return replacement
    path = f"{OBJECTS_PACKAGE}.{module_name}"
    if isinstance(replacement, ModuleType):
        module = replacement
    elif isinstance(replacement, Mapping):
        module = _module_from_mapping(module_name, replacement)
    else:
        raise FallbackError(f"replacement must be {_VALID_FORMS}; got {type(replacement).__name__}")
    _objects_package()
    sys.modules[path] = module
    return path


def _module_from_mapping(module_name: str, names: Mapping) -> ModuleType:
    if not names:
        raise FallbackError(f"the replacement mapping for {module_name!r} is empty; give it the names to serve")
    for key, value in names.items():
        if not isinstance(key, str) or not key.isidentifier() or (key.startswith("__") and key.endswith("__")):
            raise FallbackError(
                f"replacement mapping keys must be plain attribute names (not dunder names); got {key!r}"
            )
        if not callable(value):
            raise FallbackError(f"replacement mapping values must be callables; {key!r} is a {type(value).__name__}")
    module = ModuleType(f"{OBJECTS_PACKAGE}.{module_name}", f"npu-port fallback for {module_name}")
    module.__dict__.update(names)
    return module


def _objects_package() -> ModuleType:
    """The private parent of object replacements, created in ``sys.modules`` on first use."""
    package = sys.modules.get(OBJECTS_PACKAGE)
    if package is None:
        package = ModuleType(OBJECTS_PACKAGE, "Replacement objects registered with npu_port.fallbacks.registry.")
        package.__path__ = []
        sys.modules[OBJECTS_PACKAGE] = package
    return package
