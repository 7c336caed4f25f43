"""Who can apply a strategy to a target: a registry of *target appliers*, so the strategy core imports no integration.

``set_attention_strategy(target=None)`` changes the process; any other target (a diffusers model or pipeline, a model
with legacy attention, ...) is handed to an applier that an integration registered here. The integrations at the
edge import this module, never the reverse (the layers of DESIGN.md). npu-port's own register when ``npu_port`` is
imported (:mod:`npu_port.integrations`), without importing the library they adapt, so ``target=`` always works.

An applier is called as ``apply(target, attention_fn)``, or ``apply(target, None, processor_factory=cls)`` for the
``custom-processor`` strategy, where ``attention_fn`` has ``npu_port.attention``'s semantics (the strategy's router).
It returns a record of what it changed, which the strategy handle uses: ``restore()`` (undo it all, exactly),
``counts()`` ({action: number of modules}), ``describe()`` (a header line, then one line per module) and
``states()`` (per module, a named tuple). An applier that cannot use a target raises the error that says why.

Which applier gets a target: those registered with an ``accepts`` test are asked first, the latest registration
first; then the catch-all (registered without ``accepts``: the diffusers integration, whose errors say what a target
may be). Importing this module imports nothing beyond the standard library.

A strategy key that changes the model beyond attention (``fuse_ops:``, implemented by :mod:`npu_port.fuse`, layer 4)
reaches its implementation the same way: the package that implements it registers a *key applier* here
(:func:`register_key_applier`), called as ``apply(target, value)`` and returning a record with ``restore()``,
``describe()`` (a header line, then one line per change) and ``report()`` (JSON-ready); the strategy handle keeps it
next to the attention record and undoes it first.
"""

from __future__ import annotations

import _thread  # documented low-level locks: `import npu_port` imports this module and skips threading's cost
from typing import Any, Callable, Dict, List, Optional

from ..errors import StrategyError

#: ``apply(target, attention_fn, *, processor_factory=None) -> record`` (see the module docstring).
ApplyFn = Callable[..., Any]

_lock = _thread.allocate_lock()  # never held while calling out, so never re-entered
_appliers: Dict[str, "TargetApplier"] = {}  # by name, in registration order


class TargetApplier:
    """One registered applier. ``restore()`` (or leaving the ``with`` block) unregisters it; safe to call twice."""

    def __init__(self, name: str, apply: ApplyFn, accepts: Optional[Callable[[Any], bool]]) -> None:
        self.name = name
        self.apply = apply
        self.accepts = accepts

    @property
    def active(self) -> bool:
        return _appliers.get(self.name) is self

    def restore(self) -> None:
        with _lock:
            if self.active:
                del _appliers[self.name]

    def __enter__(self) -> "TargetApplier":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def __repr__(self) -> str:
        scope = "any target" if self.accepts is None else "targets it accepts"
        return f"<TargetApplier {self.name!r} for {scope}{'' if self.active else ', restored'}>"


def register_target_applier(
    name: str, apply: ApplyFn, *, accepts: Optional[Callable[[Any], bool]] = None
) -> TargetApplier:
    """Let ``set_attention_strategy(target=...)`` apply strategies through ``apply`` (see the module docstring).

    ``accepts(target) -> bool`` says which targets are this applier's; without it the applier takes any target the
    others do not (one catch-all at a time: the latest). Registering a name again replaces the earlier applier.
    Returns the registration; its ``restore()`` removes it.
    """
    if not isinstance(name, str) or not name.strip():
        raise StrategyError(f"a target applier needs a name (a non-empty str), got {name!r}")
    if not callable(apply):
        raise StrategyError(
            f"apply for target applier {name!r} must be a callable (target, attention_fn, *, processor_factory=None), "
            f"got {type(apply).__name__}"
        )
    if accepts is not None and not callable(accepts):
        raise StrategyError(
            f"accepts for target applier {name!r} must be None (any target) or a callable (target) -> bool, "
            f"got {type(accepts).__name__}"
        )
    applier = TargetApplier(name, apply, accepts)
    with _lock:
        _appliers.pop(name, None)  # a replacement goes to the end: the latest registration is asked first
        _appliers[name] = applier
    return applier


def registered_target_appliers() -> List[TargetApplier]:
    """The registered appliers, in the order they are asked."""
    with _lock:
        newest_first = list(reversed(_appliers.values()))
    return [a for a in newest_first if a.accepts is not None] + [a for a in newest_first if a.accepts is None]


_key_appliers: Dict[str, "TargetApplier"] = {}  # strategy key -> its applier (one per key: the latest)


def register_key_applier(key: str, apply: Callable[[Any, Any], Any]) -> TargetApplier:
    """Let a strategy's ``key:`` (e.g. ``fuse_ops``) be applied to its target through ``apply(target, value)`` (see
    the module docstring). Registering a key again replaces the earlier applier; ``restore()`` removes it."""
    if not isinstance(key, str) or not key.strip():
        raise StrategyError(f"a key applier needs the strategy key it applies (a non-empty str), got {key!r}")
    if not callable(apply):
        raise StrategyError(
            f"apply for strategy key {key!r} must be a callable (target, value), got {type(apply).__name__}"
        )
    applier = _KeyApplier(key, apply)
    with _lock:
        _key_appliers[key] = applier
    return applier


class _KeyApplier(TargetApplier):
    """A registered key applier; ``restore()`` unregisters it."""

    def __init__(self, key: str, apply: Callable[[Any, Any], Any]) -> None:
        super().__init__(key, apply, None)

    @property
    def active(self) -> bool:
        return _key_appliers.get(self.name) is self

    def restore(self) -> None:
        with _lock:
            if self.active:
                del _key_appliers[self.name]

    def __repr__(self) -> str:
        return f"<key applier for strategy key {self.name!r}{'' if self.active else ', restored'}>"


def key_applier(key: str) -> Callable[[Any, Any], Any]:
    """The ``apply(target, value)`` registered for strategy key ``key``, or :class:`StrategyError` saying none is."""
    with _lock:
        applier = _key_appliers.get(key)
    if applier is None:
        raise StrategyError(
            f"the strategy sets {key!r} but nothing that applies it is registered (npu_port.fuse registers fuse_ops "
            "when npu_port is imported)"
        )
    return applier.apply


def applier_for(target: Any) -> TargetApplier:
    """The applier that takes ``target``: the first whose ``accepts`` says yes, else the catch-all."""
    for applier in registered_target_appliers():
        if applier.accepts is None or applier.accepts(target):
            return applier
    names = ", ".join(a.name for a in registered_target_appliers()) or "none"
    raise StrategyError(
        f"no registered target applier takes {type(target).__name__}; registered target appliers: {names} "
        "(pass target=None to apply the strategy process-wide)"
    )
