"""Where a project's entry point and modules are, found before any of the project's code runs.

``importlib.util.find_spec("scripts.animate")`` imports ``scripts`` to read its ``__path__``: the package's
``__init__.py`` would run before npu-port's redirect, drop-ins and import watcher are installed, and a CUDA-only
import there would fail first. :func:`locate_module` asks :class:`importlib.machinery.PathFinder` for each dotted
component in turn instead, which only looks at the file system. From the entry point follow the folders npu-port
watches: the working directory, the folder that holds the entry point's top package, and what ``--watch`` adds.
"""

from __future__ import annotations

import importlib.machinery
import os
import stat
import sys
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence

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


def locate_module(name: str, search_path: Optional[Sequence[str]] = None) -> Optional[str]:
    """The file ``name`` would be imported from (``__init__.py`` for a package, a folder for a namespace package),
    or None — without running any of it. ``search_path`` defaults to ``sys.path``."""
    path: Optional[List[str]] = list(sys.path if search_path is None else search_path)
    spec = None
    for depth, part in enumerate(name.split(".")):
        if not part.isidentifier():
            return None
        fullname = ".".join(name.split(".")[: depth + 1])
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return spec.origin
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else None


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
    origin = locate_module(target, search)
    if origin is None:
        raise RunError(
            f"no module named {target!r} on the module search path (the working directory {cwd} first, as "
            "python -m puts it); run from the project's root folder, or give the script's path"
        )
    if os.path.isdir(origin) or os.path.basename(origin) == "__init__.py":  # a package: python -m runs __main__
        folder = origin if os.path.isdir(origin) else os.path.dirname(origin)
        main = os.path.join(folder, "__main__.py")
        if not os.path.isfile(main):
            raise RunError(f"{target!r} is a package without __main__.py; name the module to run (-m {target}.NAME)")
        return EntryPoint("module", f"{target}.__main__", main, cwd)
    if not origin.endswith(".py"):
        raise RunError(f"{target!r} is a compiled module ({origin}); npu-port run needs Python source to run")
    return EntryPoint("module", target, origin, cwd)


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
