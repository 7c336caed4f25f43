"""Where CANN is, which version, and whether this shell has sourced its environment.

torch_npu links against CANN's shared libraries (``libascendcl.so``, ``libhccl.so``) and finds them only when
``set_env.sh`` has put CANN's lib64 directories on ``LD_LIBRARY_PATH`` (or the system linker knows them). A toolkit
that is installed but not sourced is the most common Ascend failure, so the two questions are answered separately:
is a toolkit on disk (and which version), and can the loader find its libraries now. Nothing here imports torch.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

#: Variables set_env.sh exports, in the order torch_npu and CANN's own tools read them.
HOME_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
#: Default install locations: the toolkit layout up to CANN 8.3, and the single ``cann`` directory of CANN 8.5.
DEFAULT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
DEFAULT_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
DEFAULT_ASCEND_ROOT = "/usr/local/Ascend"
#: The libraries torch_npu cannot load without (the first ones its import asks for).
RUNTIME_LIBRARIES = ("libascendcl.so", "libhccl.so")


@dataclass(frozen=True)
class CannInstall:
    """What is known about CANN on this machine; every field may be unknown."""

    home: Optional[str]
    home_source: Optional[str]  # "$ASCEND_HOME_PATH", "default location", ...
    version: Optional[str]
    version_file: Optional[str]
    libraries: Dict[str, Optional[str]] = field(default_factory=dict)  # library -> where the loader finds it
    set_env_script: str = DEFAULT_SET_ENV
    atb_set_env_script: str = f"{DEFAULT_ASCEND_ROOT}/nnal/atb/set_env.sh"

    @property
    def missing_libraries(self) -> List[str]:
        return [name for name, where in self.libraries.items() if where is None]


def find_home(environ: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """The toolkit directory and where it came from: a set_env.sh variable, else a default location on disk."""
    for variable in HOME_VARIABLES:
        value = environ.get(variable, "").strip()
        if value:
            return value, f"${variable}"
    for path in DEFAULT_HOMES:
        if os.path.isdir(path):
            return path, "default location"
    return None, None


def version_files(home: str) -> List[Path]:
    """Files that record the toolkit version, most specific first (toolkit install info, then component info)."""
    root = Path(home)
    arch_dirs = [root / f"{platform.machine()}-linux"] + sorted(root.glob("*-linux"))
    return [
        root / "version.cfg",
        *(arch / "ascend_toolkit_install.info" for arch in arch_dirs),
        root / "compiler" / "version.info",
        root / "runtime" / "version.info",
    ]


def read_version(home: str) -> Tuple[Optional[str], Optional[str]]:
    """``(version, file)`` from the first version file with a ``version=`` / ``Version=`` line."""
    for path in version_files(home):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip().lower() == "version" and value.strip():
                return value.strip().strip("\"'"), str(path)
    return None, None


def system_library_path(name: str) -> Optional[str]:
    """Whether the system linker knows ``name`` without LD_LIBRARY_PATH (``ldconfig``'s cache)."""
    stem = name[len("lib") :].split(".so", 1)[0]
    return ctypes.util.find_library(stem)


def find_library(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """Where the dynamic loader would find ``name``: a directory on LD_LIBRARY_PATH, or the system's cache."""
    for directory in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if directory and os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    found = system_library_path(name)
    return f"{found} (system linker cache)" if found else None


def ascend_root(home: Optional[str]) -> str:
    """The directory holding ``ascend-toolkit`` / ``cann`` and ``nnal`` (``/usr/local/Ascend`` by default)."""
    if home:
        path = Path(home)
        for parent in (path, *path.parents):
            if parent.name == "ascend-toolkit" or parent.name.startswith("cann"):
                return str(parent.parent)
    return DEFAULT_ASCEND_ROOT


def set_env_script(home: Optional[str]) -> str:
    """The set_env.sh to source for this toolkit: one next to it on disk, else the documented default."""
    if home:
        path = Path(home)
        for candidate in (path / "set_env.sh", path.parent / "set_env.sh"):
            if candidate.is_file():
                return str(candidate)
    return DEFAULT_SET_ENV


def locate_cann(environ: Mapping[str, str]) -> CannInstall:
    home, source = find_home(environ)
    version, version_file = read_version(home) if home else (None, None)
    return CannInstall(
        home=home,
        home_source=source,
        version=version,
        version_file=version_file,
        libraries={name: find_library(name, environ) for name in RUNTIME_LIBRARIES},
        set_env_script=set_env_script(home),
        atb_set_env_script=f"{ascend_root(home)}/nnal/atb/set_env.sh",
    )
