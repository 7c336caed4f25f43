"""What npu-port takes from another library, found by feature detection once, and what happens when it is not there.

Why: an integration that reaches into a library's internals at the version that happened to be installed breaks
the day that library moves a name (transformers 5.24 moved a class out of a module npu-port read, and the README's
quick start crashed inside the user's forward). So every such use is declared here as a :class:`Piece` — a named
class, function, module or behaviour, the places it has lived, the integration that needs it — and resolved by an
:class:`Adapter`, one per library, the first time it is asked for. An integration then asks the adapter instead of
importing, and when a piece is missing it *declines*: :meth:`Adapter.decline` returns a :class:`Decline` (the
library, its version, the missing pieces and why), warns once per process with :class:`UpstreamDeclinedWarning`,
and keeps it for ``explain()`` / ``report()`` / ``npu-port plan`` / ``run --report`` (:func:`declines`). The model
then runs on the library's own path. Only an explicit request that cannot be honoured is an error
(:meth:`Adapter.require`), raised before any work.

Declaring the pieces as data also lets the tests remove each one from the library (``monkeypatch``) and check that
the integration that needs it declines instead of crashing: :meth:`Adapter.locations` says where to remove it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .._optional import installed_version
from ..errors import NpuPortError

#: What a piece resolved to when it is missing (``None`` can be a legitimate value of a piece).
_MISSING = object()


class UpstreamDeclinedWarning(UserWarning):
    """An integration with another library declined: a piece it needs is missing from the installed version, so
    the model runs on that library's own path (said once per process per missing piece)."""


class UpstreamMissingError(NpuPortError, RuntimeError):
    """An explicit request needs a piece of another library that the installed version lacks."""


@dataclass(frozen=True)
class Piece:
    """One thing an integration takes from a library.

    ``where``: the places it has lived, newest first, each ``"module"`` or ``"module:attr"`` (``attr`` may be
    dotted); the first that resolves wins. ``derive``: for a behaviour rather than a name, a function of the
    adapter that returns the value (or raises ``LookupError`` / ``AttributeError`` / ``TypeError`` with why it is
    unusable); used instead of ``where``. ``check``: a test of the resolved value, returning None when it is usable,
    else why not. ``feature``: the integration that needs it. ``public``: a documented public API of the library
    (preferred wherever one exists). ``since``: the first version known to have it (for people, not for logic).
    """

    name: str
    feature: str
    where: Tuple[str, ...] = ()
    derive: Optional[Callable[["Adapter"], Any]] = None
    check: Optional[Callable[[Any], Optional[str]]] = None
    public: bool = False
    since: str = ""

    def __post_init__(self) -> None:
        if bool(self.where) == (self.derive is not None):
            raise ValueError(f"piece {self.name!r}: give either where= or derive=, exactly one")


@dataclass(frozen=True)
class Decline:
    """An integration that does not take effect because pieces of a library are missing in the installed version."""

    library: str
    version: str
    feature: str
    missing: Tuple[str, ...]
    detail: str = ""

    @property
    def key(self) -> Tuple[str, str, Tuple[str, ...]]:
        return (self.library, self.feature, self.missing)

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"{self.feature}: {self.library} {self.version} has no {', '.join(self.missing)}{detail}; "
            f"left to {self.library}"
        )

    def as_dict(self) -> Dict[str, Any]:
        return {
            "library": self.library,
            "version": self.version,
            "feature": self.feature,
            "missing": list(self.missing),
            "detail": self.detail,
            "message": str(self),
        }


@dataclass
class _Log:
    """Every decline of this process, in order, and which ones were already warned about."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    seen: Dict[Tuple[str, str, Tuple[str, ...]], Decline] = field(default_factory=dict)


_LOG = _Log()


def declines() -> List[Decline]:
    """Every decline of this process so far, first first (``npu-port run --report`` lists them)."""
    with _LOG.lock:
        return list(_LOG.seen.values())


def forget_declines() -> None:
    """Forget the declines (and that they were warned about): for tests, and between runs of one process."""
    with _LOG.lock:
        _LOG.seen.clear()


def record_decline(decline: Decline, *, warn: bool = True) -> Decline:
    """Keep ``decline`` for :func:`declines` and, the first time this process sees it, warn — attributed to the
    first caller outside npu-port (the user's ``set_attention_strategy`` or ``enable_*`` line)."""
    with _LOG.lock:
        first = decline.key not in _LOG.seen
        if first:
            _LOG.seen[decline.key] = decline
    if first and warn:
        warnings.warn(str(decline), UpstreamDeclinedWarning, stacklevel=_first_frame_outside_npu_port())
    return decline


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _first_frame_outside_npu_port() -> int:
    """The ``stacklevel`` of the first frame whose code is not npu-port's (counted from the ``warnings.warn`` call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


class Adapter:
    """The pieces npu-port takes from one library, resolved once each by feature detection.

    Nothing is imported until a piece is asked for; a library that is not installed, or fails to import, has every
    piece missing with that reason. :meth:`reset` forgets what was resolved (the tests that remove pieces use it).
    """

    def __init__(self, library: str, pieces: Iterable[Piece], *, distribution: Optional[str] = None) -> None:
        self.library = library
        self.distribution = distribution or library
        self._pieces: Dict[str, Piece] = {}
        for piece in pieces:
            if piece.name in self._pieces:
                raise ValueError(f"{library}: piece {piece.name!r} declared twice")
            self._pieces[piece.name] = piece
        self._lock = threading.RLock()
        self._resolved: Dict[str, Any] = {}
        self._why: Dict[str, str] = {}

    # ---- what is declared ---------------------------------------------------------------------------------------

    def pieces(self) -> List[Piece]:
        return list(self._pieces.values())

    def piece(self, name: str) -> Piece:
        try:
            return self._pieces[name]
        except KeyError:
            raise KeyError(f"{self.library} adapter has no piece {name!r}; pieces: {', '.join(self._pieces)}") from None

    def features(self) -> List[str]:
        return list(dict.fromkeys(piece.feature for piece in self._pieces.values()))

    def locations(self, name: str) -> List[Tuple[str, str]]:
        """``(module, dotted attr)`` for each place ``where`` names (where a removal test deletes the piece);
        empty for a derived piece."""
        return [(spec.partition(":")[0], spec.partition(":")[2]) for spec in self.piece(name).where]

    # ---- the library itself -------------------------------------------------------------------------------------

    def version(self) -> Optional[str]:
        """The installed version, from its metadata (no import), or None when it is not installed."""
        return installed_version(self.distribution)

    def imported(self) -> bool:
        """Whether the library was imported already (asked without importing it)."""
        return self.library in sys.modules

    def module(self, name: str = "") -> Any:
        """``library.name`` (or the library) if it exists and imports, else None; never imports what is absent."""
        dotted = f"{self.library}.{name}" if name else self.library
        return _import_existing(dotted)

    # ---- resolving ------------------------------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        """The piece's value, or None when this version lacks it (:meth:`why_missing` says why)."""
        value = self._resolve(name)
        return None if value is _MISSING else value

    def has(self, *names: str) -> bool:
        return all(self._resolve(name) is not _MISSING for name in names)

    def why_missing(self, name: str) -> Optional[str]:
        """Why the piece is missing, or None when it is there."""
        return None if self._resolve(name) is not _MISSING else self._why.get(name, "not found")

    def _resolve(self, name: str) -> Any:
        piece = self.piece(name)
        with self._lock:
            if name in self._resolved:
                return self._resolved[name]
            value, why = self._find(piece)
            self._resolved[name] = value
            if value is _MISSING:
                self._why[name] = why
            return value

    def _find(self, piece: Piece) -> Tuple[Any, str]:
        try:
            if self.module() is None:
                version = self.version()
                return _MISSING, "not installed" if version is None else f"{self.library} {version} cannot be imported"
        except Exception as exc:  # importing the library itself failed (a broken optional dependency of it)
            return _MISSING, f"importing {self.library} fails: {type(exc).__name__}: {exc}".splitlines()[0]
        if piece.derive is not None:
            try:
                value = piece.derive(self)
            except (LookupError, AttributeError, TypeError, ValueError, ImportError) as exc:
                return _MISSING, str(exc) or type(exc).__name__
            tried = "derived"
        else:
            value, tried = _MISSING, []
            for spec in piece.where:
                module_name, _, attr = spec.partition(":")
                value = _lookup(module_name, attr)
                if value is not _MISSING:
                    break
                tried.append(spec)
            if value is _MISSING:
                return _MISSING, f"looked in {', '.join(tried)}"
        if piece.check is not None:
            problem = piece.check(value)
            if problem:
                return _MISSING, problem
        return value, ""

    def reset(self) -> None:
        """Forget every resolution (the next ``get`` looks again)."""
        with self._lock:
            self._resolved.clear()
            self._why.clear()

    # ---- declining ---------------------------------------------------------------------------------------------

    def missing(self, *names: str) -> List[str]:
        return [name for name in names if self._resolve(name) is _MISSING]

    def decline(self, feature: str, *names: str, warn: bool = True) -> Optional[Decline]:
        """None when every piece in ``names`` is there; else the :class:`Decline` (kept, and warned about once)."""
        missing = self.missing(*names)
        if not missing:
            return None
        return record_decline(self.declined(feature, missing), warn=warn)

    def declined(self, feature: str, missing: Iterable[str], detail: str = "") -> Decline:
        """The :class:`Decline` of ``feature`` for ``missing`` pieces (not recorded: see :func:`record_decline`)."""
        missing = tuple(missing)
        if not detail:
            detail = "; ".join(f"{name}: {self._why.get(name, 'not found')}" for name in missing)
        return Decline(self.library, self.version() or "(not installed)", feature, missing, detail)

    def require(self, feature: str, *names: str) -> None:
        """Raise :class:`UpstreamMissingError` when a piece in ``names`` is missing: for an explicit request that
        cannot be honoured without it (checked before any work)."""
        missing = self.missing(*names)
        if missing:
            decline = self.declined(feature, missing)
            raise UpstreamMissingError(
                f"{feature} needs {', '.join(missing)} from {self.library}, which {self.library} "
                f"{decline.version} does not have ({decline.detail}); see `npu-port doctor` for the versions "
                "npu-port supports and was tested with"
            )

    def capabilities(self) -> Dict[str, Optional[Decline]]:
        """Each feature: None when every piece it needs is there, else its :class:`Decline` (not warned about)."""
        found: Dict[str, Optional[Decline]] = {}
        for feature in self.features():
            names = [p.name for p in self._pieces.values() if p.feature == feature]
            missing = self.missing(*names)
            found[feature] = self.declined(feature, missing) if missing else None
        return found

    def __repr__(self) -> str:
        return f"<Adapter {self.library} ({len(self._pieces)} pieces)>"


def _import_existing(name: str) -> Any:
    """The module ``name`` if it exists (imported), else None — never an import of what is not there. Errors from
    importing an existing module propagate (the caller says what failed)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None else importlib.import_module(name)


def _lookup(module_name: str, attr: str) -> Any:
    try:
        value = _import_existing(module_name)
    except Exception:  # a module of the library that fails to import counts as absent
        return _MISSING
    if value is None:
        return _MISSING
    for part in filter(None, attr.split(".")):
        try:
            value = getattr(value, part, _MISSING)
        except Exception:  # a lazy module that fails to produce the attribute (transformers' _LazyModule)
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value
