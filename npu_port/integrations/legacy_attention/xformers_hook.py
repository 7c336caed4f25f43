"""diffusers' xformers switches, hooked: ``enable_xformers_memory_efficient_attention`` and friends install
npu-port's attention strategy instead (:func:`hook_enable_xformers`; :class:`XformersHook` undoes it).

CUDA-era scripts call ``pipe.enable_xformers_memory_efficient_attention()`` (or the model's, or
``set_use_memory_efficient_attention_xformers(True)``). Without CUDA and xformers that raises — in diffusers'
``Attention`` or in a project's copy of the setter — and where it works it pins one kernel. While the hook is on,
these three methods of diffusers' ``DiffusionPipeline`` and ``ModelMixin`` do instead:

* enable: apply a strategy to the object — ``set_attention_strategy(strategy, target=self)`` when it has diffusers
  attention modules (which routes its legacy ones too), ``patch_legacy_attention`` for its legacy ones (their
  classes routed process-wide, repo-local xformers setters quieted) — where ``strategy`` is the hook's, else the
  process-wide active one, else "auto"; ``attention_op`` is ignored; one log line says what was installed;
* disable (or ``set_use...(False)``): restore what enable installed on that object (the very processor objects and
  functions); on an object enable never touched, diffusers' own code runs.

``XformersHook.restore()`` (or calling the hook) restores every route still installed and puts diffusers' methods
back — the same function objects.
"""

from __future__ import annotations

import collections
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ... import _patching
from ...hits import HitLog
from .contract import XFORMERS_SETTER, find_legacy_attention
from .patch import LegacyPatch, patch_legacy_attention

logger = logging.getLogger("npu_port.legacy")

#: The key of the hook's patches in :mod:`npu_port._patching`.
KEY = "legacy_attention.xformers_hook"

ENABLE = "enable_xformers_memory_efficient_attention"
#: How many enable calls npu-port run's summary remembers.
HISTORY = 256
DISABLE = "disable_xformers_memory_efficient_attention"


@dataclass
class XformersRoute:
    """What the hooked ``enable`` installed on one pipeline or model."""

    strategy: Any = None  # the StrategyHandle for its diffusers attention modules, if it has any
    legacy: Optional[LegacyPatch] = None  # the patch of its legacy attention classes, if it has any

    def restore(self) -> None:
        for part in (self.legacy, self.strategy):
            if part is not None:
                part.restore()


def _diffusers_classes() -> List[type]:
    """diffusers' ``ModelMixin`` and ``DiffusionPipeline``, as the diffusers adapter finds them (one it cannot find
    declines, and keeps diffusers' own switches); none when diffusers cannot be imported (nothing to hook)."""
    from ...upstream.diffusers.attention import xformers_switch_classes

    found = xformers_switch_classes()
    if not found:
        logger.debug("npu-port: no diffusers class to hook the xformers switches of")
    return found


def _has_diffusers_attention(target: Any) -> bool:
    from ..diffusers import classes
    from ..diffusers.targets import attention_modules

    try:
        return bool(attention_modules(target, classes.load()))
    except TypeError:  # a pipeline whose class the adapter could not find (declined): not a target
        return False


def _active_strategy() -> Any:
    from ...strategy.process import active_strategy

    return active_strategy()


def _describe(route: XformersRoute) -> str:
    parts = []
    if route.strategy is not None:
        parts.append(f"npu-port attention strategy {route.strategy.strategy.name!r}")
    if route.legacy is not None:
        if route.strategy is not None:  # the strategy applied to the object routes its legacy modules too
            how = "by that strategy inside it; elsewhere by the process-wide one"
        else:
            active = _active_strategy()
            how = f"strategy {active.name!r}" if active is not None else "npu_port.attention's default kernel order"
            how = f"process-wide {how}"
        parts.append(f"legacy attention {', '.join(route.legacy.classes)} routed ({how})")
    return " and ".join(parts) or "nothing (no diffusers or legacy attention module found)"


class XformersHook:
    """diffusers' xformers switches, hooked (see the section comment above). ``restore()`` or ``hook()`` unhooks."""

    def __init__(self, strategy: Any = None) -> None:
        self.strategy = strategy
        self.patched: List[_patching.Patch] = []
        self.routes: "weakref.WeakKeyDictionary[Any, XformersRoute]" = weakref.WeakKeyDictionary()
        #: what enable installed, for npu-port run's summary, kept when the object is freed (a script's pipeline
        #: is gone by exit): the object's class name, the description and the router that counts its calls — no
        #: processors, no model. Bounded: a server enabling per request keeps the latest entries.
        self.history: "collections.deque[Tuple[str, str, Any]]" = collections.deque(maxlen=HISTORY)
        #: every legacy patch enable made (class-level, holding no model), undone by restore() even for objects
        #: freed meanwhile.
        self._legacy: List[LegacyPatch] = []
        self.restored = False
        #: the switches the project turned on (each call, by method, with where it was made): npu-port run's report
        #: lists them under NPU120.
        self.hits = HitLog()

    # ---- what the hooked methods do ---------------------------------------------------------------------------

    def enable(self, obj: Any, attention_op: Any = None, method: str = ENABLE) -> XformersRoute:
        """Apply the strategy to ``obj`` (once; a second enable keeps the first route). ``method``: the hooked switch
        that asked, named as what applied the strategy in npu-port run's count (:mod:`npu_port.strategy.tally`)."""
        with _patching.LOCK:
            route = self.routes.get(obj)
            if route is not None:
                return route
            strategy = self.strategy or _active_strategy() or "auto"
            route = XformersRoute()
            try:
                if find_legacy_attention(obj):
                    route.legacy = patch_legacy_attention(obj)
                if _has_diffusers_attention(obj):
                    from ...strategy.api import set_attention_strategy
                    from ...strategy.tally import TALLY

                    with TALLY.via(f"{type(obj).__name__}.{method}()"):
                        route.strategy = set_attention_strategy(strategy, target=obj)
            except BaseException:
                route.restore()
                raise
            self.routes[obj] = route
            router = route.strategy.router if route.strategy is not None else None
            self.history.append((type(obj).__qualname__, _describe(route), router))
            if route.legacy is not None:
                self._legacy.append(route.legacy)
        logger.warning(
            "npu-port: %s.%s() -> %s instead of xformers%s",
            type(obj).__name__,
            ENABLE,
            _describe(route),
            f" (attention_op={attention_op!r} ignored)" if attention_op is not None else "",
        )
        return route

    def disable(self, obj: Any, original_setter: Callable[..., Any]) -> None:
        """Restore what :meth:`enable` installed on ``obj``; without one, run diffusers' own ``set_use...(False)``."""
        with _patching.LOCK:
            route = self.routes.pop(obj, None)
        if route is None:
            original_setter(obj, False)
            return
        route.restore()
        logger.info("npu-port: %s.%s() restored the attention it had", type(obj).__name__, DISABLE)

    # ---- installing and removing the hook ---------------------------------------------------------------------

    def _methods(self, cls: type) -> List[Tuple[str, Callable[..., Any]]]:
        hook = self
        original_setter = getattr(cls, XFORMERS_SETTER)

        def enable_xformers_memory_efficient_attention(self, attention_op=None):
            hook.enable(self, attention_op)
            hook.hits.hit(ENABLE)

        def disable_xformers_memory_efficient_attention(self):
            hook.disable(self, original_setter)

        def set_use_memory_efficient_attention_xformers(self, valid, attention_op=None):
            if valid:
                hook.enable(self, attention_op, XFORMERS_SETTER)
                hook.hits.hit(XFORMERS_SETTER)
            else:
                hook.disable(self, original_setter)

        methods = []
        for fn in (
            enable_xformers_memory_efficient_attention,
            disable_xformers_memory_efficient_attention,
            set_use_memory_efficient_attention_xformers,
        ):
            original = getattr(cls, fn.__name__)
            fn.__doc__ = f"npu-port: installs npu-port's attention strategy (hooked {cls.__name__}.{fn.__name__})."
            fn.__npu_port_original__ = original  # type: ignore[attr-defined]
            methods.append((fn.__name__, fn))
        return methods

    def install(self) -> "XformersHook":
        for cls in _diffusers_classes():
            for name, fn in self._methods(cls):
                self.patched.append(_patching.replace(cls, name, fn, key=KEY))
        return self

    def restore(self) -> None:
        """Restore every route still installed, then put diffusers' methods back (if still ours). Idempotent."""
        global _HOOK
        if self.restored:
            return
        self.restored = True
        with _patching.LOCK:
            routes: List[Any] = list(self.routes.values()) + self._legacy  # legacy class patches of freed objects too
            self.routes.clear()
            self._legacy.clear()
            for patch in reversed(self.patched):
                _patching.release(patch)  # if still ours
            self.patched.clear()
            if _HOOK is self:
                _HOOK = None
        for route in routes:
            route.restore()

    def __call__(self) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "restored" if self.restored else f"{len(self.routes)} routes"
        return f"<XformersHook strategy={self.strategy!r}; {state}>"


_HOOK: Optional[XformersHook] = None


def hook_enable_xformers(strategy: Any = None) -> XformersHook:
    """Hook diffusers' xformers switches (see the section comment above); returns the hook — ``.restore()`` or
    calling it unhooks. ``strategy``: what enable installs (a name, file, ``Strategy``); None = the process-wide
    active strategy at the time of the call, else ``"auto"``. Hooking again returns the hook already installed.
    Without an importable diffusers there is nothing to hook, and the hook hooks nothing."""
    global _HOOK
    with _patching.LOCK:
        if _HOOK is None:
            _HOOK = XformersHook(strategy).install()
        return _HOOK


def unhook_enable_xformers() -> None:
    """Undo :func:`hook_enable_xformers` (nothing to do when it is not hooked)."""
    if _HOOK is not None:
        _HOOK.restore()


def hooked_routes() -> List[Dict[str, Any]]:
    """What the hooked enable installed, per object (``npu-port run``'s summary): its class, a description, and the
    attention calls its own strategy handle routed (legacy classes count under the process-wide strategy)."""
    if _HOOK is None:
        return []
    return [
        {"object": name, "routed": described, "calls": dict(router.calls) if router is not None else {}}
        for name, described, router in list(_HOOK.history)
    ]


def hook_hits() -> Optional[HitLog]:
    """The xformers switches the hooked methods answered, by method, with where each was called (None: not hooked)."""
    return _HOOK.hits if _HOOK is not None else None


def xformers_route(obj: Any) -> Optional[XformersRoute]:
    """What the hooked enable installed on ``obj`` (None when nothing)."""
    return _HOOK.routes.get(obj) if _HOOK is not None else None
