"""diffusers pieces: the attention dispatcher (0.35 onwards) — its backend names, its registry, its requirement check.

Two integrations use it:

* :data:`DISPATCHER` — a process-wide strategy (``set_attention_strategy(..., target=None)``) sets
  ``DIFFUSERS_ATTN_BACKEND`` for child processes and, when diffusers is already imported, makes the same choice in
  this process: diffusers reads the variable once, at import, so the registry's active backend is set at run time,
  after diffusers' own requirement check. diffusers has no public API for a process-wide choice (its
  ``attention_backend`` context manager is scoped to a ``with`` block, which a handle restored in any order cannot
  be), so the registry is private. Missing pieces decline: the variable is still set, diffusers keeps its backend.
* :data:`BACKEND` — npu-port's ``"npu_port"`` backend for context parallelism (:mod:`npu_port.parallel.backend`):
  one member added to ``AttentionBackendName`` and one entry in each of the registry's tables, taken out again
  exactly. Only an explicit ``--ulysses`` / ``--ring`` request needs it, so a missing piece is an error before any
  work (:func:`npu_port.upstream.diffusers.parallel.require`).

diffusers before 0.35 has no dispatcher at all (every piece missing); 0.35 has no context-parallel table
(``_supports_context_parallel``, 0.36).
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from ..adapter import Adapter, Piece

#: A process-wide strategy's choice made in diffusers' dispatcher at run time.
DISPATCHER = "process-wide strategy in diffusers' attention dispatcher"
#: npu-port's own backend registered in diffusers' dispatcher (context parallelism).
BACKEND = "npu-port backend in diffusers' attention dispatcher (context parallelism)"
#: Where the dispatcher lives (0.35 onwards).
DISPATCH_MODULE = "diffusers.models.attention_dispatch"

DISPATCHER_PIECES = ("AttentionBackendName", "_AttentionBackendRegistry", "_check_attention_backend_requirements")
#: The first diffusers release with the dispatcher (``dispatch_attention_fn`` and its backend registry).
DISPATCHER_SINCE = "0.35"
BACKEND_PIECES = ("AttentionBackendName", "_AttentionBackendRegistry", "backend tables")

#: The registry's tables a backend has an entry in (each a dict keyed by the enum member).
_TABLES = ("_backends", "_constraints", "_supported_arg_names")
#: What ``enum`` keeps of a member (the member is added as if it had been declared).
_ENUM_PARTS = (("_member_map_", dict), ("_value2member_map_", dict), ("_member_names_", list))


def _str_enum(value: Any) -> Any:
    if isinstance(value, type) and issubclass(value, enum.Enum) and issubclass(value, str):
        return None
    return "AttentionBackendName is not a str enum"


def _has_active_backend(registry: Any) -> Any:
    return None if hasattr(registry, "_active_backend") else "_AttentionBackendRegistry has no _active_backend"


@dataclass(frozen=True)
class BackendTables:
    """The enum and registry tables a backend is added to."""

    names: Any
    registry: Any


def _backend_tables(adapter: Adapter) -> BackendTables:
    """The registry keeps a backend in three dicts and the names of context-parallel ones in a set; the enum can take
    one more member the way ``enum`` stores its own."""
    names, registry = adapter.get("AttentionBackendName"), adapter.get("_AttentionBackendRegistry")
    if names is None or registry is None:
        raise LookupError("needs AttentionBackendName and _AttentionBackendRegistry")
    problems = [
        f"_AttentionBackendRegistry.{t} is not a dict" for t in _TABLES if not isinstance(vars(registry).get(t), dict)
    ]
    if not isinstance(vars(registry).get("_supports_context_parallel"), set):
        problems.append("_AttentionBackendRegistry has no _supports_context_parallel set (no context parallelism)")
    problems += [
        f"AttentionBackendName.{a} is not a {k.__name__}"
        for a, k in _ENUM_PARTS
        if not isinstance(getattr(names, a, None), k)
    ]
    if problems:
        raise LookupError("; ".join(problems))
    return BackendTables(names, registry)


PIECES = (
    Piece(
        "AttentionBackendName",
        DISPATCHER,
        where=(
            "diffusers:AttentionBackendName",
            "diffusers.models:AttentionBackendName",
            f"{DISPATCH_MODULE}:AttentionBackendName",
        ),
        check=_str_enum,
        public=True,
        since=DISPATCHER_SINCE,
    ),
    Piece(
        "_AttentionBackendRegistry",
        DISPATCHER,
        where=(f"{DISPATCH_MODULE}:_AttentionBackendRegistry",),
        check=_has_active_backend,
        since=DISPATCHER_SINCE,
    ),
    Piece(
        "_check_attention_backend_requirements",
        DISPATCHER,
        where=(f"{DISPATCH_MODULE}:_check_attention_backend_requirements",),
        check=lambda f: None if callable(f) else "not callable",
        since=DISPATCHER_SINCE,
    ),
    Piece("backend tables", BACKEND, derive=_backend_tables, since="0.36"),
)


def _adapter() -> Adapter:
    from . import ADAPTER

    return ADAPTER


# ---- the process-wide choice ----------------------------------------------------------------------------------


def loaded() -> bool:
    """Whether diffusers is imported in this process (asked without importing it): only then is its dispatcher's
    backend chosen at run time; otherwise diffusers reads ``DIFFUSERS_ATTN_BACKEND`` when it is imported."""
    return _adapter().imported()


def in_this_release() -> bool:
    """Whether the installed diffusers is a release with the dispatcher (0.35 on): before it no process-wide backend
    exists to choose, and its absence is by design, not a decline."""
    from .attention import released_by

    return released_by(DISPATCHER_SINCE)


def decline_process_wide() -> Any:
    """None when the dispatcher's pieces are there; else the :class:`~npu_port.upstream.adapter.Decline` (kept,
    warned about once). Only asked once diffusers is imported."""
    return _adapter().decline(DISPATCHER, *DISPATCHER_PIECES)


def active_backend() -> Any:
    """The dispatcher's active backend now (the pieces were found)."""
    return _adapter().get("_AttentionBackendRegistry")._active_backend


def set_active_backend(backend: Any) -> None:
    _adapter().get("_AttentionBackendRegistry")._active_backend = backend


def usable_backend(value: str) -> Any:
    """The enum member named ``value`` once diffusers' requirement check accepts it; raises ``ValueError`` (no such
    backend), ``RuntimeError`` or ``ImportError`` (its package is missing) as diffusers does."""
    adapter = _adapter()
    member = adapter.get("AttentionBackendName")(value)
    adapter.get("_check_attention_backend_requirements")(member)
    return member


# ---- npu-port's backend ---------------------------------------------------------------------------------------

_ABSENT = object()


class _Undo:
    """What adding a backend changed, put back exactly by calling it."""

    def __init__(self) -> None:
        self.entries: List[Tuple[Dict[Any, Any], Any, Any]] = []
        self.steps: List[Callable[[], None]] = []

    def set_entry(self, table: Dict[Any, Any], key: Any, value: Any) -> None:
        self.entries.append((table, key, table.get(key, _ABSENT)))
        table[key] = value

    def __call__(self) -> None:
        for step in reversed(self.steps):
            step()
        for table, key, old in reversed(self.entries):
            if old is _ABSENT:
                table.pop(key, None)
            else:
                table[key] = old
        self.entries, self.steps = [], []


def add_backend(value: str, member_name: str, function: Callable[..., Any]) -> Tuple[Any, Callable[[], None]]:
    """Register ``function`` as the dispatcher backend ``value`` (enum member ``member_name``), taking context
    parallelism; returns the member and the function that removes it again, leaving the enum and the registry exactly
    as they were. Only called once :func:`~npu_port.upstream.diffusers.parallel.require` found the pieces."""
    tables = _adapter().get("backend tables")
    names, registry = tables.names, tables.registry
    undo = _Undo()
    member = str.__new__(names, value)
    member._name_ = member_name
    member._value_ = value
    undo.set_entry(names._member_map_, member_name, member)
    undo.set_entry(names._value2member_map_, value, member)
    member_names = list(names._member_names_)
    names._member_names_.append(member_name)
    undo.steps.append(lambda: names._member_names_.__setitem__(slice(None), member_names))
    old = vars(names).get(member_name, _ABSENT)
    type.__setattr__(names, member_name, member)
    undo.steps.append(
        lambda: type.__delattr__(names, member_name) if old is _ABSENT else type.__setattr__(names, member_name, old)
    )
    undo.set_entry(registry._backends, member, function)
    undo.set_entry(registry._constraints, member, [])
    undo.set_entry(registry._supported_arg_names, member, set(inspect.signature(function).parameters))
    supports = registry._supports_context_parallel
    if value not in supports:
        supports.add(value)
        undo.steps.insert(0, lambda: supports.discard(value))
    return member, undo


def backend_member(value: str) -> Any:
    """``AttentionBackendName(value)`` (the backend must be registered)."""
    return _adapter().get("AttentionBackendName")(value)
