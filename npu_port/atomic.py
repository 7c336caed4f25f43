"""Atomic file writes with unique temporary names: the one way npu-port writes a file the user keeps.

A fixed temporary name (``.report.json.tmp``) is not enough: two runs with the same ``--output`` then write the same
temporary file, one renames the other's half-written bytes into place, and the image and report can come from
different runs. Each write here gets its own temporary file (``tempfile.mkstemp`` in the destination's folder, so
``os.replace`` is a rename on one file system), is flushed to disk, and replaces the destination in one step; on any
failure, Ctrl-C included, the temporary file is removed and the destination is left as it was.

A link is written through only onto what npu-port writes (:func:`link_problem`): a link ``latest.png`` to
``runs/7.png`` keeps pointing there and ``runs/7.png`` gets the new image, but a link ``out.png`` to a user's
``notes.txt``, to a folder, or a loop is refused — the file at the other end is someone else's, and writing through
the link would replace it with bytes of another kind (replacing the link itself would silently cut a link the user
made). A device or FIFO at the end of a link (``/dev/stdout``) is written into, as a shell redirection would.

Whether a folder can be written at all is asked here too (:func:`folder_problem`), before any expensive work: the
only answer that holds for root, read-only mounts, ACLs and full disks alike is to create (and remove) a uniquely
named file there — ``os.access`` and the mode bits say yes to root on a folder it cannot really write (``/sys``).

Only the standard library: every layer may use this.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

#: The process umask, read once at import (reading it means setting it, which is not safe later among threads).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class LinkRefused(OSError):
    """The destination is a link onto something that is not what is being written (:func:`link_problem`)."""


def link_problem(path: PathLike) -> Optional[str]:
    """Why writing ``path`` would follow a link onto something that is not what is written there, or None.

    A link is followed when it ends on a regular file, or on nothing yet, whose extension is the link's own (the
    file of the kind its name promises, compared without case), or on a device or FIFO, and always from ``/dev``
    (``/dev/stdout`` redirected to a file). Otherwise the reason
    completes a sentence that starts with the path: ``'out.png' is a link to /home/me/notes.txt, not a .png file;
    ...``. Checked before any expensive work by every command that writes, and again by :func:`atomic_path`.
    """
    link = Path(path)
    try:
        if not link.is_symlink():
            return None
        mode = os.stat(link).st_mode
    except FileNotFoundError:
        mode = None  # a dangling link: writing creates its target
    except OSError as exc:
        return f"is a link that cannot be followed ({exc.strerror or type(exc).__name__})"
    target = Path(os.path.realpath(link))
    if os.path.abspath(link).startswith("/dev/") or str(target).startswith(("/proc/", "/dev/")):
        return None  # /dev/stdout, /dev/fd/N: the stream the caller opened, whatever it is (a redirected file too)
    if mode is not None and stat.S_ISDIR(mode):
        return f"is a link to the folder {target}; give a file path"
    if mode is not None and not stat.S_ISREG(mode):
        return None  # a device or FIFO: written into, never replaced
    if target.suffix.lower() == link.suffix.lower():
        return None
    kind = f"a {link.suffix} file" if link.suffix else "a file without an extension"
    return (
        f"is a link to {target}, not {kind}; npu-port will not write through it: remove the link or give another path"
    )


@contextlib.contextmanager
def atomic_path(path: PathLike, *, mode: int = 0o666, exact_mode: bool = False) -> Iterator[Path]:
    """Yield a unique temporary path beside ``path``; when the block ends without error it replaces ``path``.

    For writers that want a file name (``PIL.Image.save``, ``matplotlib``'s ``savefig``): the temporary name keeps
    ``path``'s suffix so format detection by extension still works. The parent folder is created if missing. The file
    gets ``mode`` less the umask, as ``open()`` would give it (``mkstemp`` alone makes it private); with
    ``exact_mode``, ``mode`` itself (a rewritten file keeps the permissions it had). A link onto something that is not
    what is written raises :class:`LinkRefused` (an ``OSError``) before anything is written (:func:`link_problem`).
    """
    destination = Path(path)
    problem = link_problem(destination)
    if problem is not None:
        raise LinkRefused(f"{destination} {problem}")
    if destination.is_symlink():  # keep the link: write what it points to (a device or /proc/self/fd/N: into it)
        target = Path(os.path.realpath(destination))
        if (
            str(destination).startswith("/dev/")
            or str(target).startswith(("/proc/", "/dev/"))
            or (target.exists() and not target.is_file())
        ):
            yield from _through(destination)
            return
        destination = target
    if destination.exists() and not destination.is_file():  # /dev/null, a FIFO, a folder: never replace them
        if destination.is_dir():
            raise IsADirectoryError(f"{destination} is a folder, not a file")
        yield from _through(destination)
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(
        prefix=f".{destination.stem}.", suffix=f".tmp{destination.suffix}", dir=destination.parent
    )
    os.close(fd)
    try:
        yield Path(temporary)
        with open(temporary, "rb+") as fh:  # the writer closed it; make its bytes durable before the rename
            os.fsync(fh.fileno())
        os.chmod(temporary, mode if exact_mode else mode & ~_UMASK)
        os.replace(temporary, destination)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _through(destination: Path) -> Iterator[Path]:
    """For a destination that is not a regular file (a device such as ``/dev/null`` or ``/dev/stdout``, a FIFO):
    the writer writes a temporary file, whose bytes are then written *into* the destination — renaming over it
    would replace the device node with a plain file (``-o /dev/null`` would break /dev/null for the machine)."""
    fd, temporary = tempfile.mkstemp(prefix=".npu-port.", suffix=destination.suffix)
    os.close(fd)
    try:
        yield Path(temporary)
        with open(temporary, "rb") as source, open(destination, "wb") as target:
            target.write(source.read())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def folder_problem(folder: Path, *, create: bool = False) -> Optional[str]:
    """Why no file can be created in ``folder`` (None when one can).

    ``create=False``: the folder need not exist yet; its nearest existing ancestor is probed (the write would create
    the folders in between). ``create=True``: the folder is created first (a cache folder).
    """
    target = Path(folder)
    if create:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _os_reason(exc)
    else:
        while not target.exists() and target.parent != target:
            target = target.parent
    if not target.is_dir():
        return f"{target} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".npu-port-probe-", dir=target)
    except OSError as exc:
        return _os_reason(exc)
    os.close(fd)
    os.unlink(probe)
    return None


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__  # the file name would be the probe's random one


@contextlib.contextmanager
def file_lock(lock: PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock (``fcntl.flock``) on the file ``lock`` for the block — for writers that read,
    merge and write back (the auto cache) or write several files as one set (an image and its report). The file is
    created if missing and left in place: removing a lock file while another process waits on it would let a third
    one in. Where ``fcntl`` is missing (Windows) nothing is locked; each file is still written atomically."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        yield
        return
    path = Path(lock)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)
    return Path(path)


def write_text(path: PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    return write_bytes(path, text.encode(encoding))


def write_with(path: PathLike, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(temporary_path)`` and move what it wrote to ``path`` atomically; returns the path."""
    with atomic_path(path) as temporary:
        writer(temporary)
    return Path(path)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by ``None``, recursively (dicts, lists, tuples).

    ``json.dumps`` writes bare ``NaN`` / ``Infinity``, which is not JSON: other tools refuse the file. Whoever
    writes a report records *that* a value was not finite separately (a flag next to it); this only makes the file
    valid.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_json(path: PathLike, data: Any, *, indent: int = 2, sort_keys: bool = False) -> Path:
    """Write ``data`` as valid JSON (non-finite floats become ``null``, see :func:`json_safe`) atomically."""
    text = json.dumps(json_safe(data), indent=indent, sort_keys=sort_keys, default=str, allow_nan=False)
    return write_text(path, text + "\n")
