"""What a piece of ``npu-port run`` handled, counted where it happened: per *hit kind*, how often, and the first few
places in the code that made the call.

Every mechanism ``npu-port run`` applies (the CUDA redirect, the served drop-ins and fallbacks, the flash_attn
drop-in's functions, diffusers' xformers hook) counts each call it answered in a :class:`HitLog`, under a kind of its
own (``"Tensor.cuda"``, ``"flash_attn_func"``...); :mod:`npu_port.runtime.handled` maps each kind to the scan rule
whose pattern it is, so ``npu-port run --report`` lists by rule code what the run handled, and where.

A place is the innermost frame of the user's code: not npu-port's, torch's, the standard library's (import
machinery, runpy, contextlib) or an installed package's (``site-packages``: diffusers, or the ``typing_extensions``
wrapper around ``torch.cuda.amp.GradScaler``) — the project's line that asked for CUDA, directly or through a
library. Where the stack holds no such frame (a library's thread), the innermost installed package's. Finding it walks
the stack (a few frames: how each file counts is remembered) only while fewer than :data:`PLACES` places are
known for the kind; after that a hit is one dict update. Lives at the bottom layer: the redirect (device layer) and
the drop-ins (above it) both record here.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import sysconfig
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar

#: How many distinct places are kept per kind ("the first few").
PLACES = 5

#: One order for every log: a place's number says which came first, across mechanisms (``next`` is atomic).
_ORDER = itertools.count()

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")})
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

#: What a file's frames are: the user's code, an installed package's, or skipped (npu-port, torch, the stdlib).
USER, INSTALLED, SKIPPED = 0, 1, 2
_KINDS: Dict[str, int] = {}  # co_filename -> USER, INSTALLED or SKIPPED

Place = Tuple[str, int]
F = TypeVar("F", bound=Callable[..., Any])


def _kind(filename: str) -> int:
    known = _KINDS.get(filename)
    if known is not None:
        return known
    path = filename if filename.startswith("<") else os.path.abspath(filename)
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep if getattr(torch, "__file__", None) else None
    installed = any(part in path for part in _INSTALLED)
    if (
        path.startswith("<frozen ")
        or path.startswith(_PACKAGE)
        or (torch_dir is not None and path.startswith(torch_dir))
        or (path.startswith(_STDLIB) and not installed)  # a system python keeps its site-packages under the stdlib
    ):
        kind = SKIPPED
    else:
        kind = INSTALLED if installed else USER
    _KINDS[filename] = kind  # torch's files run only once sys.modules["torch"] (with __file__) exists
    return kind


def caller_place() -> Optional[Place]:
    """``(file, line)`` of the innermost frame above the caller in the user's code (else in an installed package);
    None when every frame is npu-port's, torch's or the standard library's. The search starts at the caller's
    caller and skips npu-port's own frames, so a wrapper need not say how deep it sits."""
    return _place(sys._getframe(1).f_back)


def _place(frame: Any) -> Optional[Place]:
    library: Optional[Place] = None
    while frame is not None:
        filename = frame.f_code.co_filename
        kind = _KINDS.get(filename)
        if kind is None:
            kind = _kind(filename)
        if kind == USER:
            return filename, frame.f_lineno
        if kind == INSTALLED and library is None:
            library = filename, frame.f_lineno
        frame = frame.f_back
    return library


class HitLog:
    """Counts per hit kind, with the first :data:`PLACES` places of each (see the module docstring).

    ``kinds`` lists every kind a counter was made for, hit or not (so a test can check that each is mapped to a
    rule, or said not to be).
    """

    def __init__(self) -> None:
        self.counts: Dict[str, int] = {}
        self.places: Dict[str, List[Tuple[int, Place]]] = {}
        self.kinds: Set[str] = set()
        self._placed: Dict[str, Set[Place]] = {}  # per kind, the places of ``places`` (a hit checks it: be quick)

    def hit(self, kind: str) -> None:
        """Count one hit of ``kind``, placed at its caller in the user's code (see :func:`caller_place`)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        placed = self._placed.get(kind)
        if placed is None:
            placed = self._placed[kind] = set()
        elif len(placed) >= PLACES:
            return
        place = _place(sys._getframe(1))
        if place is not None and place not in placed:
            placed.add(place)
            self.places.setdefault(kind, []).append((next(_ORDER), place))

    def counter(self, kind: str) -> Callable[[], None]:
        """A callback that counts one hit of ``kind`` (what a wrapper calls)."""
        self.kinds.add(kind)
        return functools.partial(self.hit, kind)

    def counts_calls(self, function: F) -> F:
        """Decorator: count each call of ``function`` (kind: its name) that returns normally — a call that raised
        was not handled —, placed at its caller. Calls from npu-port's own code (one drop-in function calling
        another) are not counted, so each call the project made counts once."""
        kind = function.__name__
        self.kinds.add(kind)

        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            if not sys._getframe(1).f_globals.get("__name__", "").startswith("npu_port."):
                self.hit(kind)
            return result

        return counted  # type: ignore[return-value]

    def clear(self) -> None:
        """Forget every hit (the kinds stay)."""
        self.counts.clear()
        self.places.clear()
        self._placed.clear()

    def snapshot(self) -> Dict[str, Dict[str, Any]]:
        """``{kind: {"count": n, "where": [(order, (file, line)), ...]}}`` for every kind hit (JSON-ready once the
        places are formatted; the order numbers let places of several logs be merged first-come)."""
        return {kind: {"count": count, "where": list(self.places.get(kind, ()))} for kind, count in self.counts.items()}
