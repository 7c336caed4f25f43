"""What a piece of ``npu-port run`` handled, counted where it happened: per *hit kind*, how often, who made the call
(the project or a library), and the first few places of each.

Every mechanism ``npu-port run`` applies (the CUDA redirect, the served drop-ins and fallbacks, the flash_attn
drop-in's functions, diffusers' xformers hook) counts each call it answered in a :class:`HitLog`, under a kind of its
own (``"Tensor.cuda"``, ``"flash_attn_func"``...); :mod:`npu_port.runtime.handled` maps each kind to the scan rule
whose pattern it is, so ``npu-port run --report`` lists by rule code what the run handled, and where.

Who made a call is the nearest frame, walking out from the hit, that does more than pass a call on. Passed over:
npu-port's own frames (the wrapper that counts), the standard library's (import machinery, runpy, contextlib,
functools, threading: the standard library never asks for CUDA itself, so a call through it was asked for by whoever
called it), torch.cuda's own modules (they *are* the CUDA API: ``torch.cuda.amp.autocast()`` forwards the caller's
request to ``torch.autocast("cuda")``) and typing_extensions' deprecation wrappers (around ``torch.cuda.amp``'s
classes). The first frame left is the *owner*:

* the project's code (any file outside npu-port, the standard library, torch and installed packages): the hit is the
  project's, placed at that line;
* a library — torch (``torch.manual_seed`` seeding CUDA), an installed package (``site-packages``: diffusers importing
  xformers because the drop-in exists, ``from_pretrained`` emptying the CUDA cache, a dependency's decorator entering
  autocast): the hit is counted under the library's top-level package name, placed at the library's line, never at
  the project line that called the library;
* nothing (a callback run by a thread or ``atexit`` with only the standard library above it): :data:`NO_CALLER`.

Cheap by construction: the owner is usually the wrapper's caller (one or two frames, each file's role remembered),
and the place is kept only while fewer than :data:`PLACES` places are known for the kind and owner; after that a hit
is the walk and two dict updates. Lives at the bottom layer: the redirect (device layer) and the drop-ins (above it)
both record here.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import sysconfig
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar

#: How many distinct places are kept per kind and owner ("the first few").
PLACES = 5

#: The owner of a call the project's own code made (package names never contain "<").
PROJECT = "<project>"
#: The owner of a call with no frame but npu-port's and the standard library's above it (a thread's or atexit's
#: callback): nobody's code asked for it where it was made.
NO_CALLER = "(no caller)"
#: The role of a frame that only passes a call on (walked past).
PASS = "<pass>"

#: One order for every log: a place's number says which came first, across mechanisms (``next`` is atomic).
_ORDER = itertools.count()

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")})
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
#: Installed code that only passes a call on, as paths below the folder holding the package (see the docstring).
_FORWARDING = ("typing_extensions.py", "typing_extensions" + os.sep, os.path.join("torch", "cuda", ""))
_OWNERS: Dict[str, str] = {}  # co_filename -> PROJECT, PASS or a library's name

Place = Tuple[str, int]
F = TypeVar("F", bound=Callable[..., Any])


def _library(path: str) -> Optional[str]:
    """The top-level package an installed file belongs to (PASS for a forwarding one); None when not installed."""
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file:  # torch's files run only once sys.modules["torch"] (with __file__) exists
        torch_dir = os.path.dirname(os.path.abspath(torch_file))
        if path.startswith(torch_dir + os.sep):
            below = os.path.relpath(path, os.path.dirname(torch_dir))
            return PASS if below.startswith(_FORWARDING) else "torch"
    for marker in _INSTALLED:
        if marker in path:
            below = path.split(marker, 1)[1]
            if below.startswith(_FORWARDING):
                return PASS
            top = below.split(os.sep, 1)[0]
            return top[:-3] if top.endswith(".py") else top
    return None


def owner_of(filename: str) -> str:
    """What a frame of ``filename`` is: :data:`PROJECT`, :data:`PASS` or a library's name (remembered per file)."""
    known = _OWNERS.get(filename)
    if known is not None:
        return known
    path = filename if filename.startswith("<") else os.path.abspath(filename)
    if path.startswith("<frozen ") or path.startswith(_PACKAGE):
        owner = PASS
    else:
        library = _library(path)  # before the stdlib: a system python keeps its site-packages under the stdlib
        if library is not None:
            owner = library
        elif path.startswith(_STDLIB):
            owner = PASS
        else:
            owner = PROJECT
    _OWNERS[filename] = owner
    return owner


def _made_by(frame: Any) -> Tuple[str, Any]:
    """``(owner, frame)``: the first frame from ``frame`` outwards that is not passed over (None: :data:`NO_CALLER`)."""
    owners = _OWNERS
    while frame is not None:
        filename = frame.f_code.co_filename
        owner = owners.get(filename)
        if owner is None:
            owner = owner_of(filename)
        if owner != PASS:
            return owner, frame
        frame = frame.f_back
    return NO_CALLER, None


def caller() -> Tuple[str, Optional[Place]]:
    """``(owner, (file, line))`` of the call the caller is answering (see the module docstring); the place is None
    for :data:`NO_CALLER`. The search starts at the caller's caller and passes over npu-port's own frames, so a
    wrapper need not say how deep it sits."""
    owner, frame = _made_by(sys._getframe(1).f_back)
    return owner, (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None


class HitLog:
    """Counts per hit kind and owner, with the first :data:`PLACES` places of each (see the module docstring).

    ``counts``: every hit per kind, whoever made it; ``owned``: per ``(kind, owner)``. ``kinds`` lists every kind a
    counter was made for, hit or not (so a test can check that each is mapped to a rule, or said not to be).
    """

    def __init__(self) -> None:
        self.counts: Dict[str, int] = {}
        self.owned: Dict[Tuple[str, str], int] = {}
        self.places: Dict[Tuple[str, str], List[Tuple[int, Place]]] = {}
        self.kinds: Set[str] = set()
        self._placed: Dict[Tuple[str, str], Set[Place]] = {}  # the places of ``places`` (a hit checks it: be quick)

    def hit(self, kind: str) -> None:
        """Count one hit of ``kind``, made by its caller's owner (see :func:`caller`)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        owner, frame = _made_by(sys._getframe(1))
        key = (kind, owner)
        self.owned[key] = self.owned.get(key, 0) + 1
        placed = self._placed.get(key)
        if placed is None:
            placed = self._placed[key] = set()
        elif len(placed) >= PLACES:
            return
        if frame is None:
            return
        place = (frame.f_code.co_filename, frame.f_lineno)
        if place not in placed:
            placed.add(place)
            self.places.setdefault(key, []).append((next(_ORDER), place))

    def counter(self, kind: str) -> Callable[[], None]:
        """A callback that counts one hit of ``kind`` (what a wrapper calls)."""
        self.kinds.add(kind)
        return functools.partial(self.hit, kind)

    def counts_calls(self, function: F) -> F:
        """Decorator: count each call of ``function`` (kind: its name) that returns normally — a call that raised
        was not handled —, made by its caller's owner. Calls from npu-port's own code (one drop-in function calling
        another) are not counted, so each call made to it counts once."""
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
        self.owned.clear()
        self.places.clear()
        self._placed.clear()

    def snapshot(self) -> Dict[str, Dict[str, Any]]:
        """For every kind hit: ``{"count": every hit, "project": the project's hits, "where": its places,
        "libraries": {owner: {"count": n, "where": places}}}`` (owners other than the project: libraries and
        :data:`NO_CALLER`), each place ``(order, (file, line))`` — JSON-ready once formatted; the order numbers let
        places of several logs be merged first-come."""
        result: Dict[str, Dict[str, Any]] = {
            kind: {"count": count, "project": 0, "where": [], "libraries": {}} for kind, count in self.counts.items()
        }
        for (kind, owner), count in list(self.owned.items()):
            where = list(self.places.get((kind, owner), ()))
            entry = result.setdefault(kind, {"count": count, "project": 0, "where": [], "libraries": {}})  # (a thread)
            if owner == PROJECT:
                entry["project"], entry["where"] = count, where
            else:
                entry["libraries"][owner] = {"count": count, "where": where}
        return result
