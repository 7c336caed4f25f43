"""Replace a function or class inside a project module: ``--override pkg.mod:func=my_mod:func``.

Some CUDA-only code cannot be served by a drop-in or a redirect: a project's own helper that calls a custom kernel,
asserts on the GPU model, or wraps flash_attn in a way npu-port cannot see. ``register_fallback`` replaces a whole
compiled module; an override replaces one name inside one Python module — ``pkg.mod:func`` or ``pkg.mod:Class.method``
— with the user's own ``my_mod:func`` (or, from Python, any object).

Timing matters: ``from pkg.mod import func`` copies the name into the importer when it runs, so an override applied
later would miss those copies. Under ``npu-port run`` (or :func:`npu_port.activate`) an override is applied the
moment ``pkg.mod`` finishes executing, before any other module can import from it; :func:`override` does the same
for a module not yet imported, and replaces the name at once in one that is (copies made before stay as they were —
said in the docstring, not guessed around). The replacement module is imported only then, so it may itself import
``pkg.mod`` (to call the original). :meth:`Override.restore` puts the original back, unless someone replaced the name
again since (their value is kept).
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import RunError
from .locate import find_module, not_found

_MISSING = object()
FORMAT = "pkg.module:name=my_module:name (name may be dotted: Class.method)"


def split_reference(text: str, what: str) -> Tuple[str, List[str]]:
    """``"pkg.mod:Class.attr"`` -> ``("pkg.mod", ["Class", "attr"])``, or a :class:`RunError` naming ``what``."""
    module, colon, attribute = text.strip().partition(":")
    parts = attribute.split(".") if attribute else []
    if (
        not colon
        or not module
        or not all(p.isidentifier() for p in module.split("."))
        or not parts
        or not all(p.isidentifier() for p in parts)
    ):
        raise RunError(f"{what} {text!r} is not module:name; expected {FORMAT}")
    return module, parts


def _missing_module(name: str, search_path: Optional[Sequence[str]], where: str) -> Optional[str]:
    """Why ``name`` cannot be imported (one phrase; ``where`` follows a top-level name that is nowhere), or None
    when it can be (or already is)."""
    if name in sys.modules:
        return None
    found = find_module(name, search_path)
    return None if found.found else not_found(name, found, where)


class Override:
    """One replaced name: ``target`` (``"pkg.mod:func"``) -> ``replacement`` (an object or ``"my_mod:func"``)."""

    def __init__(self, target: str, replacement: Any) -> None:
        self.target = target.strip()
        self.module, self.path = split_reference(self.target, "override target")
        if isinstance(replacement, str):
            split_reference(replacement, "override replacement")
        self.replacement = replacement
        self.applied = False
        self.restored = False
        self._owner: Any = None
        self._original: Any = _MISSING
        self._installed: Any = _MISSING

    @property
    def replacement_name(self) -> str:
        if isinstance(self.replacement, str):
            return self.replacement.strip()
        module = getattr(self.replacement, "__module__", "?")
        return f"{module}:{getattr(self.replacement, '__qualname__', repr(self.replacement))}"

    def check_locatable(self, search_path: Optional[Sequence[str]] = None) -> None:
        """Fail before the project runs when the target or the replacement module cannot be found at all (namespace
        packages included, at any depth; nothing of the project is imported to find them)."""
        problem = _missing_module(self.module, search_path, "on the module search path")
        if problem:
            raise RunError(f"--override {self.target}: {problem}")
        if isinstance(self.replacement, str):
            module, _ = split_reference(self.replacement, "override replacement")
            where = "on the module search path (the working directory and the entry point's folder are on it)"
            problem = _missing_module(module, search_path, where)
            if problem:
                raise RunError(f"--override {self.target}={self.replacement}: {problem}")

    def _resolve_replacement(self) -> Any:
        if not isinstance(self.replacement, str):
            return self.replacement
        module_name, parts = split_reference(self.replacement, "override replacement")
        value: Any = importlib.import_module(module_name)
        for depth, part in enumerate(parts):
            if not hasattr(value, part):
                raise RunError(
                    f"--override {self.target}={self.replacement}: {module_name}:{'.'.join(parts[: depth + 1])} "
                    "does not exist"
                )
            value = getattr(value, part)
        return value

    def apply(self, module: ModuleType) -> None:
        """Replace the name in ``module`` (the target module, just executed or already imported)."""
        owner: Any = module
        for depth, part in enumerate(self.path[:-1]):
            if not hasattr(owner, part):
                raise RunError(self._missing(module, depth))
            owner = getattr(owner, part)
        name = self.path[-1]
        if not hasattr(owner, name):
            raise RunError(self._missing(module, len(self.path) - 1))
        replacement = self._resolve_replacement()
        self._owner, self._original = owner, vars(owner).get(name, _MISSING)
        setattr(owner, name, replacement)
        self._installed = vars(owner).get(name, _MISSING)
        self.applied = True

    def _missing(self, module: ModuleType, depth: int) -> str:
        owner: Any = module
        for part in self.path[:depth]:
            owner = getattr(owner, part)
        names = sorted(n for n, v in vars(owner).items() if not n.startswith("_") and callable(v))
        where = ".".join([self.module, *self.path[:depth]])
        shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
        missing = self.path[depth]
        return f"--override {self.target}: {where} has no attribute {missing!r} (it has: {shown or 'nothing callable'})"

    def restore(self) -> None:
        """Put the original back (if the name still holds our replacement). Idempotent."""
        if self.restored:
            return
        self.restored = True
        if not self.applied:
            return
        name = self.path[-1]
        if vars(self._owner).get(name, _MISSING) is self._installed:
            if self._original is _MISSING:  # it was inherited (Class.method defined on a base class)
                delattr(self._owner, name)
            else:
                setattr(self._owner, name, self._original)

    def as_dict(self) -> Dict[str, Any]:
        return {"target": self.target, "replacement": self.replacement_name, "applied": self.applied}

    def __repr__(self) -> str:
        state = "restored" if self.restored else ("applied" if self.applied else "waiting for the import")
        return f"<Override {self.target} -> {self.replacement_name}: {state}>"


class Overrides:
    """Several overrides, applied as their modules are imported (the callback of npu-port's import watcher)."""

    def __init__(self, overrides: Sequence[Override] = ()) -> None:
        self.items = list(overrides)
        self._lock = threading.RLock()  # applying imports the replacement module, itself watched

    @classmethod
    def parse(cls, specs: Sequence[str]) -> "Overrides":
        items = []
        for spec in specs:
            target, equals, replacement = spec.partition("=")
            if not equals:
                raise RunError(f"--override {spec!r} has no '='; expected {FORMAT}")
            items.append(Override(target, replacement))
        return cls(items)

    @property
    def names(self) -> List[str]:
        return sorted({item.module for item in self.items})

    def on_import(self, module: ModuleType) -> None:
        with self._lock:
            for item in self.items:
                if item.module == module.__name__ and not item.applied and not item.restored:
                    item.apply(module)

    def apply_imported(self) -> None:
        """Apply at once where the target module is already imported."""
        for item in self.items:
            module = sys.modules.get(item.module)
            if module is not None and not item.applied:
                item.apply(module)

    def restore(self) -> None:
        for item in reversed(self.items):
            item.restore()

    def summary(self) -> List[Dict[str, Any]]:
        return [item.as_dict() for item in self.items]


class OverrideHandle:
    """What :func:`override` returns: the :class:`Override`, and the watcher waiting for its module if any."""

    def __init__(self, item: Override, watcher: Any = None) -> None:
        self.override = item
        self._watcher = watcher

    @property
    def applied(self) -> bool:
        return self.override.applied

    def restore(self) -> None:
        if self._watcher is not None:
            self._watcher.uninstall()
            self._watcher = None
        self.override.restore()

    def __enter__(self) -> "OverrideHandle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def __repr__(self) -> str:
        return repr(self.override)


def override(target: str, replacement: Union[str, Any]) -> OverrideHandle:
    """Replace ``target`` (``"pkg.mod:func"`` or ``"pkg.mod:Class.method"``) with ``replacement`` (an object, or
    ``"my_mod:func"``); undo with ``.restore()`` (also a context manager).

    If ``pkg.mod`` is already imported the name is replaced now (modules that did ``from pkg.mod import func``
    before keep their copy); otherwise the moment it is imported, before anything can copy it.
    """
    from .watch_imports import ImportWatcher

    item = Override(target, replacement)
    module = sys.modules.get(item.module)
    if module is not None:
        item.apply(module)
        return OverrideHandle(item)
    watcher = ImportWatcher([], Overrides([item]).on_import, names=[item.module])
    return OverrideHandle(item, watcher.install())
