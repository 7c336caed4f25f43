"""Where a project's entry point and modules are, found before any of the project's code runs.

``importlib.util.find_spec("scripts.animate")`` imports ``scripts`` to read its ``__path__``: the package's
``__init__.py`` would run before npu-port's redirect, drop-ins and import watcher are installed, and a CUDA-only
import there would fail first. :func:`find_module` resolves each dotted component in turn as the import system
would — ``sys.meta_path`` in order, the path-based search over each folder's finder — but only looks at the file
system: a regular package's folder is its ``__path__`` (one whose ``__init__.py`` calls ``pkgutil.extend_path`` or
``declare_namespace`` gets every same-named folder on its parent's path, as those calls give it), and a folder
without ``__init__.py`` is a namespace package spread over every such folder (PEP 420). ``PathFinder`` itself cannot
be asked for a nested namespace package: its ``__path__`` reads the parent's from ``sys.modules``, which holds
nothing of the project yet. From the entry point follow the folders npu-port watches: the working directory, the
folder that holds the entry point's top package, and what ``--watch`` adds.
"""

from __future__ import annotations

import importlib.machinery
import os
import pkgutil
import re
import stat
import sys
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from ..errors import RunError


@dataclass(frozen=True)
class EntryPoint:
    """What ``npu-port run`` runs: a script file, or a module (``-m``) with the file it resolves to."""

    kind: str  # "script" | "module"
    name: str  # the script's path as given, or the dotted module name
    path: str  # the file that runs (absolute)
    sys_path0: str  # what goes first on sys.path, as python itself puts it there

    @property
    def top_package_parent(self) -> str:
        """The folder holding the entry point's top package (for a script outside any package: its folder)."""
        if self.kind == "module":
            folder = os.path.dirname(self.path)
            for _ in range(self.name.count(".")):
                folder = os.path.dirname(folder)
            return folder
        folder = os.path.dirname(self.path)
        while os.path.isfile(os.path.join(folder, "__init__.py")) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        return folder


@dataclass(frozen=True)
class Found:
    """Where a dotted name resolved, or why it did not (``problem``: a phrase such as ``"the package 'pkg'
    (/p/pkg) has no module 'x'"``, or ``""`` when its top-level name is nowhere on the search path)."""

    name: str
    origin: Optional[str] = None  # the module's file (a package's __init__.py); None for a namespace package
    locations: Tuple[str, ...] = ()  # a package's folders (its __path__); empty for a plain module
    is_package: bool = False
    problem: Optional[str] = None

    @property
    def found(self) -> bool:
        return self.problem is None


#: An ``__init__.py`` that widens its own ``__path__`` (pkgutil- and pkg_resources-style namespace packages).
_EXTENDS_PATH = re.compile(rb"\b(extend_path|declare_namespace)\s*\(")


def _path_entry_finder(entry: str):
    """The finder the path-based import uses for one ``sys.path`` entry (``""`` is the working directory)."""
    try:
        return pkgutil.get_importer(entry or os.getcwd())
    except (ImportError, OSError, ValueError):
        return None


def _search_path(fullname: str, path: Sequence[str]) -> Optional[Found]:
    """What ``PathFinder`` finds for ``fullname`` in ``path``: the first module or regular package in path order,
    else the namespace package made of every portion seen — read from each folder's finder, nothing imported."""
    portions: List[str] = []
    for entry in path:
        finder = _path_entry_finder(entry)
        try:
            spec = finder.find_spec(fullname) if finder is not None and hasattr(finder, "find_spec") else None
        except (ImportError, OSError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.loader is not None:
            return _from_spec(fullname, spec, path)
        portions += [p for p in spec.submodule_search_locations or [] if p not in portions]
    return Found(fullname, None, tuple(portions), True) if portions else None


def _from_spec(fullname: str, spec, parent_path: Sequence[str]) -> Found:
    origin = spec.origin if spec.origin not in (None, "namespace") else None
    if spec.submodule_search_locations is None:
        return Found(fullname, origin)
    try:
        locations = list(spec.submodule_search_locations)
    except (KeyError, AttributeError):  # a lazily computed __path__ that wants the parent imported
        locations = []
    if origin and os.path.basename(origin) == "__init__.py":
        locations += _extended(origin, fullname.rpartition(".")[2], parent_path, locations)
    return Found(fullname, origin, tuple(locations), True)


def _extended(init: str, last: str, parent_path: Sequence[str], locations: Sequence[str]) -> List[str]:
    """The folders ``pkgutil.extend_path`` would add to a package whose ``__init__.py`` calls it."""
    try:
        with open(init, "rb") as fh:
            if not _EXTENDS_PATH.search(fh.read()):
                return []
    except OSError:
        return []
    extra = [os.path.join(entry or os.getcwd(), last) for entry in parent_path]
    return [folder for folder in extra if os.path.isdir(folder) and folder not in locations]


def _find_one(fullname: str, path: Sequence[str]) -> Optional[Found]:
    """Ask ``sys.meta_path`` in order, as ``import`` does; the path-based finder is answered from the file system
    (frozen modules are left to it too: their source file is what runs), and finders that themselves ask the rest
    of ``sys.meta_path`` (npu-port's own) are skipped."""
    for finder in list(sys.meta_path):
        if finder is importlib.machinery.PathFinder:
            found = _search_path(fullname, path)
        elif finder is importlib.machinery.FrozenImporter or getattr(finder, "delegates_to_meta_path", False):
            continue
        else:
            try:
                spec = finder.find_spec(fullname, list(path) if "." in fullname else None)
            except Exception:  # noqa: BLE001 - a third-party finder's failure: not an answer, and not our crash
                spec = None
            found = _from_spec(fullname, spec, path) if spec is not None else None
        if found is not None:
            return found
    return None


def _describe(found: Found) -> str:
    kind = "package" if found.origin else "namespace package"
    return f"the {kind} {found.name!r} ({', '.join(found.locations) or 'no folder'})"


def find_module(name: str, search_path: Optional[Sequence[str]] = None) -> Found:
    """Where ``name`` would be imported from, without running any of it — or, in ``problem``, the first component
    that is not there. ``search_path`` defaults to ``sys.path``."""
    path: Sequence[str] = list(sys.path if search_path is None else search_path)
    parts = name.split(".")
    found: Optional[Found] = None
    for depth, part in enumerate(parts):
        if not part.isidentifier():
            return Found(name, problem=f"{part!r} is not a module name")
        fullname = ".".join(parts[: depth + 1])
        if found is not None and not found.is_package:
            return Found(name, problem=f"{found.name!r} is a module ({found.origin}), not a package")
        result = _find_one(fullname, path)
        if result is None:
            return Found(name, problem=f"{_describe(found)} has no module {part!r}" if found is not None else "")
        found, path = result, result.locations
    assert found is not None
    return found


def locate_module(name: str, search_path: Optional[Sequence[str]] = None) -> Optional[str]:
    """The file ``name`` would be imported from (``__init__.py`` for a package, a folder for a namespace package),
    or None — without running any of it. ``search_path`` defaults to ``sys.path``."""
    found = find_module(name, search_path)
    if not found.found:
        return None
    return found.origin or (found.locations[0] if found.locations else None)


def not_found(name: str, found: Found, where: str) -> str:
    """``no module named 'x' <where>`` for a top-level name missing, else what is missing below which package."""
    return f"no module named {name!r} {where}" if not found.problem else f"no module named {name!r}: {found.problem}"


def file_kind(path: str) -> str:
    """What a path that exists but is not a regular file or folder is, in words (for messages)."""
    mode = os.stat(path).st_mode
    for test, kind in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a file"


def resolve_entry(target: str, as_module: bool, cwd: Optional[str] = None) -> EntryPoint:
    """The entry point ``npu-port run [-m] target`` names, or a :class:`RunError` saying why there is none."""
    cwd = os.path.abspath(cwd or os.getcwd())
    if not as_module:
        script = os.path.abspath(os.path.join(cwd, target))
        if os.path.isdir(script):
            if os.path.isfile(os.path.join(script, "__main__.py")):
                return EntryPoint("script", target, os.path.join(script, "__main__.py"), script)
            raise RunError(f"{target!r} is a folder without __main__.py; give a script, or -m package.module")
        if os.path.exists(script) and not os.path.isfile(script):  # /dev/null, a FIFO: python would read no script
            raise RunError(f"{target!r} is not a regular file ({file_kind(script)}); give the path of a Python script")
        if not os.path.isfile(script):
            hint = ""
            if not target.endswith(".py") and locate_module(target, [cwd, *sys.path[1:]]) is not None:
                hint = f" (to run the module {target!r}, as python -m does: npu-port run -m {target})"
            raise RunError(f"no such script: {target!r}{hint}")
        return EntryPoint("script", target, script, os.path.dirname(script))
    search = [cwd, *sys.path[1:]]
    found = find_module(target, search)
    if not found.found:
        where = (
            f"on the module search path (the working directory {cwd} first, as python -m puts it); run from the "
            "project's root folder, or give the script's path"
        )
        raise RunError(not_found(target, found, where))
    if found.is_package:  # python -m runs the package's __main__, found on its whole __path__
        main = find_module(f"{target}.__main__", search)
        if not main.found or main.is_package:
            raise RunError(f"{target!r} is a package without __main__.py; name the module to run (-m {target}.NAME)")
        found, target = main, main.name
    if not found.origin or not found.origin.endswith(".py"):
        raise RunError(f"{target!r} is a compiled module ({found.origin}); npu-port run needs Python source to run")
    return EntryPoint("module", target, found.origin, cwd)


def watch_roots(
    entry: EntryPoint,
    extra: Sequence[str] = (),
    cwd: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> List[str]:
    """The folders whose modules are the project's: the working directory, the entry point's folder and its top
    package's parent, the folders on ``PYTHONPATH`` (where people put a project's own packages: ``PYTHONPATH=. python
    scripts/animate.py``), and ``extra`` (``--watch``; each must be an existing folder). Absolute, each once; the
    import watcher still leaves out installed packages under any of them."""
    roots: List[str] = []
    for folder in extra:
        if not os.path.isdir(folder):
            raise RunError(f"--watch {folder!r}: no such folder (give a folder holding the project's modules)")
    cwd = cwd or os.getcwd()
    python_path = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    on_path = [os.path.join(cwd, p) for p in python_path.split(os.pathsep) if p and os.path.isdir(os.path.join(cwd, p))]
    for folder in (cwd, os.path.dirname(entry.path), entry.top_package_parent, *on_path, *extra):
        real = os.path.realpath(folder)
        if real not in roots:
            roots.append(real)
    return roots
