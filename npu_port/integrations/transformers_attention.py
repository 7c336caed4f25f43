"""A strategy applied to transformers models: their SDPA calls run on the strategy's kernels.

Why: transformers models (CLIP, T5, UMT5: the text encoders of diffusers pipelines) compute attention through the
function their config names in transformers' ``AttentionInterface``; on an NPU their ``sdpa`` runs torch_npu's SDPA,
which takes the slow path that builds the whole score matrix for T5's float position bias. npu-port routes exactly
one thing there: the ``torch.nn.functional.scaled_dot_product_attention`` call that transformers' own ``"sdpa"``
function makes, for the modules of the models a strategy was applied to.

How, and why this way:

* The ``"sdpa"`` entry of the interface is replaced, with ``AttentionInterface.register`` (transformers' public way to
  add or override an attention function, reached through :mod:`npu_port.upstream.transformers`), by
  :func:`routed_sdpa`, which calls the entry that was there. For a module of a routed model it runs that entry under
  :class:`SdpaToRoute`, a ``torch.overrides.TorchFunctionMode`` that hands the SDPA call to the strategy's router.
  Everything transformers does around the call (masks, position bias, grouped keys, caches, output layout) stays
  transformers' own code at whatever version is installed: nothing of it is copied, so a release that changes it
  cannot break the routing (5.24 moved a class 5.23's copy read). For every other module it is the original call.
* Routes are found from the attention module itself (the interface's first argument), in a weak map filled when a
  strategy is applied: a gradient-checkpoint recompute, which runs a layer outside its model's forward, takes the
  same route as the forward it recomputes; a model built from an applied model's config, or a copy, is not in the
  map and runs transformers' own path.
* Configs are never changed: ``config._attn_implementation`` stays what the user or transformers chose. A model set
  to ``eager`` (for its attention weights, say) or to another implementation is left on it and reported as not
  routed, with the reason; ``model.set_attn_implementation("sdpa")`` later routes it.
* Versions without the interface (transformers before 4.50) and models whose attention is their own code (not the
  interface) decline: the model runs on transformers' own path, with one warning and a line in ``explain()``.

The diffusers applier calls :func:`apply_to_transformers` for a pipeline's transformers components (text_encoder,
text_encoder_2, ...); a bare ``PreTrainedModel`` target reaches it through its own target applier
(:mod:`npu_port.integrations`).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from contextvars import ContextVar
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from ..upstream import Decline
from ..upstream import transformers as upstream
from ..weak import weak
from .diffusers.routing import AttentionFn, Route, Tally

#: The path routed calls are counted under (``handle.applied.calls``).
PATH = "transformers"
#: The implementation whose SDPA call is routed.
ROUTED = upstream.ROUTED_IMPLEMENTATION
#: Why a call inside a routed module was left to transformers (``Tally.declined``).
NO_SDPA_CALL = "transformers' sdpa attention made no SDPA call (its code changed): computed by transformers"

#: torch's SDPA itself, as torch dispatches it (``F.scaled_dot_product_attention`` is this object unless something
#: patched the attribute, as ``npu-port plan`` does while it records).
_SDPA = torch._C._nn.scaled_dot_product_attention
_SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}

_LOCK = threading.RLock()
_USERS = 0
_original: Optional[Callable[..., Any]] = None  # the "sdpa" entry before the first registration
#: True while a routed module's transformers ``sdpa`` runs: its SDPA call is about to be routed (and counted there).
_ROUTING: ContextVar[bool] = ContextVar("npu_port_transformers_routing", default=False)
#: attention module -> the routes applied to it, innermost last (weak: a freed model leaves nothing behind).
_ROUTES: "weakref.WeakKeyDictionary[torch.nn.Module, Tuple[Route, ...]]" = weakref.WeakKeyDictionary()


class SdpaToRoute(TorchFunctionMode):
    """While active, ``torch.nn.functional.scaled_dot_product_attention`` calls go to ``route`` (counted); every
    other torch function runs as it is. torch disables a mode while its own handler runs, so the kernels' own SDPA
    calls do not come back here."""

    def __init__(self, route: Route) -> None:
        super().__init__()
        self.route = route
        self.routed = 0

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        values = dict(_SDPA_DEFAULTS)
        values.update(zip(_SDPA_PARAMETERS, args))
        values.update(kwargs)
        unknown = set(values) - set(_SDPA_PARAMETERS)
        if unknown:  # an SDPA argument newer than npu-port: let torch run the call as it was made
            self.route.decline(f"SDPA argument(s) {', '.join(sorted(unknown))} not known to npu-port: run by torch")
            return func(*args, **kwargs)
        self.routed += 1
        return self.route.attend(
            PATH,
            values["query"],
            values["key"],
            values["value"],
            values["attn_mask"],
            dropout_p=values["dropout_p"],
            is_causal=values["is_causal"],
            scale=values["scale"],
            enable_gqa=values["enable_gqa"],
        )


#: ``torch.compiler.is_compiling`` (torch 2.3 on), looked up once: :func:`routed_sdpa` asks it on every call.
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _compiling() -> bool:
    """Whether torch.compile is tracing this call; never under torch before 2.3, which then breaks the graph here
    as before."""
    return _IS_COMPILING is not None and _IS_COMPILING()


def routed_sdpa(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The interface's ``"sdpa"`` entry while npu-port is registered: transformers' own ``sdpa`` function, with its
    SDPA call on the module's route when the module belongs to a routed model. Under torch.compile it is
    transformers' own function alone: the router is Python the compiler cannot trace (a ``fullgraph=True`` compile,
    as ``generate`` does with a static cache, would fail on it), and torch's SDPA compiles as it does without
    npu-port."""
    original = routed_sdpa.original
    if _compiling():
        return original(module, *args, **kwargs)
    try:
        routes = _ROUTES.get(module)
    except TypeError:  # not weak-referenceable / hashable: never one of ours
        routes = None
    if not routes:
        return original(module, *args, **kwargs)
    mode = SdpaToRoute(routes[-1])
    token = _ROUTING.set(True)
    try:
        with mode:
            result = original(module, *args, **kwargs)
    finally:
        _ROUTING.reset(token)
    if not mode.routed:
        routes[-1].decline(NO_SDPA_CALL)
    return result


routed_sdpa.original = None  # type: ignore[attr-defined]


def sdpa_call_is_routed() -> bool:
    """Whether an SDPA call made now comes from a routed transformers module (the strategy's router sees it, so
    whoever counts direct SDPA calls, as ``npu-port plan`` does, must not count it again)."""
    return _ROUTING.get()


# ---- registration in transformers' AttentionInterface -----------------------------------------------------------


def register() -> None:
    """Put :func:`routed_sdpa` under ``"sdpa"`` (counted; the first call does the work)."""
    global _USERS, _original
    with _LOCK:
        if _USERS == 0:
            current = upstream.sdpa_entry()
            if current is not routed_sdpa:  # ours may still be there if someone wrapped it since: keep its original
                _original = current
                routed_sdpa.original = current  # type: ignore[attr-defined]
            upstream.set_sdpa_entry(routed_sdpa)
        _USERS += 1


def unregister() -> None:
    """One user fewer; the last one puts the entry back — unless someone registered their own since (theirs
    stays, and, if it calls ours, ours keeps calling the original: nothing is routed without a route)."""
    global _USERS
    with _LOCK:
        if _USERS == 0:
            return
        _USERS -= 1
        if _USERS:
            return
        if upstream.sdpa_entry() is routed_sdpa and _original is not None:
            upstream.set_sdpa_entry(_original)


def registered() -> bool:
    with _LOCK:
        return _USERS > 0


def routed_modules() -> int:
    """Modules with a route now (for tests: back to 0 once every handle is restored or the models are freed)."""
    with _LOCK:
        return len(_ROUTES)


def _push(module: torch.nn.Module, route: Route) -> None:
    _ROUTES[module] = _ROUTES.get(module, ()) + (route,)


def _pop(module: torch.nn.Module, route: Route) -> None:
    routes = tuple(r for r in _ROUTES.get(module, ()) if r is not route)
    if routes:
        _ROUTES[module] = routes
    else:
        _ROUTES.pop(module, None)


# ---- applying --------------------------------------------------------------------------------------------------


class TextModelState(NamedTuple):
    """One transformers model of a target: its name, its class, the implementation it had when the strategy was
    applied, the one it has now, and whether its attention is routed now (``reason`` when it is not)."""

    name: str
    model: str
    original: str
    now: str
    routed: bool
    reason: str


def _not_routed_reason(implementation: Optional[str]) -> Optional[str]:
    if implementation == ROUTED:
        return None
    if implementation is None:
        return "this transformers version has no attention implementation setting"
    return (
        f"attention implementation {implementation!r} kept as set (npu-port routes {ROUTED!r}; "
        f"model.set_attn_implementation({ROUTED!r}) routes it)"
    )


class AppliedTransformers:
    """A strategy applied to transformers models (a pipeline's text encoders, or one model): :meth:`restore` removes
    the routes (idempotent). ``calls``: routed calls by path; ``declines``: what could not be routed and why."""

    def __init__(self, target: Any, tally: Optional[Tally] = None) -> None:
        self._target = weak(target)
        self.tally = tally if tally is not None else Tally()
        #: (name, model, implementation it had, why it cannot be routed at all: None when it is routable)
        self.models: List[Tuple[str, "weakref.ref[Any]", str, Optional[str]]] = []
        self.own_code: List[str] = []  # models whose attention is their own code: not routed
        self.declines: List[Decline] = []
        self._routed: List[Tuple["weakref.ref[torch.nn.Module]", Route]] = []
        self._registered = False
        self.restored = False

    @property
    def target(self) -> Any:
        return self._target()

    @property
    def calls(self) -> Counter:
        return self.tally.calls

    @property
    def total_calls(self) -> int:
        return self.tally.total

    @property
    def declined(self) -> Counter:
        """Calls inside routed modules left to transformers, by reason."""
        return self.tally.declined

    def text_states(self) -> List[TextModelState]:
        return self.states()

    def add(self, name: str, model: Any, attention_fn: AttentionFn) -> None:
        """Route the SDPA calls of ``model``'s attention modules to ``attention_fn``, counted under ``name``."""
        if not self._registered:
            register()
            self._registered = True
        self._note(name, model, None)
        route = Route(attention_fn, name, self.tally)
        with _LOCK:
            for module in model.modules():
                self._routed.append((weakref.ref(module), route))
                _push(module, route)

    def _note(self, name: str, model: Any, unroutable: Optional[str]) -> None:
        implementation = upstream.attention_implementation(model)
        self.models.append((name, weakref.ref(model), str(implementation), unroutable))

    def counts(self) -> Dict[str, int]:
        return {"text models": len(self.models)}

    def states(self) -> List[TextModelState]:
        states = []
        for name, ref, original, unroutable in self.models:
            model = ref()
            if model is None:
                states.append(TextModelState(name, "-", original, "freed", False, "the model was freed"))
                continue
            now = upstream.attention_implementation(model)
            reason = unroutable or ("restored" if self.restored else _not_routed_reason(now))
            states.append(TextModelState(name, type(model).__name__, original, str(now), reason is None, reason or ""))
        return states

    def describe(self) -> str:
        state = "restored" if self.restored else "active"
        lines = [f"{len(self.models)} transformers models ({state}): their {ROUTED!r} attention's SDPA call routed"]
        for s in self.states():
            how = "routed" if s.routed else f"not routed: {s.reason}"
            lines.append(f"  {s.name or s.model}: {s.model}, attention implementation {s.now} ({how})")
        if self.tally.calls.get(PATH):
            lines.append(f"  transformers attention calls routed: {self.tally.calls[PATH]}")
        lines += [f"  not routed: {decline}" for decline in self.declines]
        return "\n".join(lines)

    def upstream_declines(self) -> List[Decline]:
        return list(self.declines)

    def report(self) -> Dict[str, Any]:
        return {
            "models": [state._asdict() for state in self.states()],
            "own_code": list(self.own_code),
            "declines": [decline.as_dict() for decline in self.declines],
            "calls": dict(self.tally.calls),
        }

    def restore(self) -> None:
        if self.restored:
            return
        self.restored = True
        with _LOCK:
            for ref, route in reversed(self._routed):
                module = ref()
                if module is not None:
                    _pop(module, route)
            self._routed.clear()
        if self._registered:
            unregister()
            self._registered = False

    def __repr__(self) -> str:
        return f"<AppliedTransformers {len(self.models)} models; {'restored' if self.restored else 'active'}>"


def text_models(components: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The transformers models among ``(name, component)`` pairs (a pipeline's text encoders, image encoders),
    recognised even when transformers moved ``PreTrainedModel`` (they are then declined with that reason)."""
    return [(name, c) for name, c in components if upstream.looks_like_model(c)]


def _uses_interface(model: Any) -> bool:
    return any(upstream.uses_attention_interface(type(module)) for module in model.modules())


def apply_to_transformers(
    target: Any,
    attention_fn: Optional[AttentionFn],
    *,
    processor_factory: Optional[Callable[[], Any]] = None,
    models: Optional[List[Tuple[str, Any]]] = None,
    tally: Optional[Tally] = None,
) -> AppliedTransformers:
    """Route the SDPA calls of ``models`` (default: ``target`` itself, a ``PreTrainedModel``) to ``attention_fn``.

    The target applier for transformers models, and what the diffusers applier calls for a pipeline's transformers
    components. What cannot be routed is declined, never raised: a transformers version without the interface (one
    warning, named in ``describe()``), a model whose attention is its own code. All or nothing otherwise: a failure
    part-way undoes what was done. ``processor_factory`` (the ``custom-processor`` strategy) installs diffusers
    processors, which transformers models do not have: refused.
    """
    if processor_factory is not None or attention_fn is None:
        raise TypeError(
            f"custom-processor installs diffusers attention processors; {type(target).__name__} is a transformers "
            "model, whose attention is an implementation, not a processor: give a kernel strategy (sdpa, npu, ...)"
        )
    if not callable(attention_fn):
        raise TypeError(f"attention_fn must be callable, got {type(attention_fn).__name__}")
    chosen = models if models is not None else [("", target)]
    applied = AppliedTransformers(target, tally)
    decline = upstream.ADAPTER.decline(upstream.TEXT_ENCODERS, "PreTrainedModel", "AttentionInterface")
    if decline is not None:
        applied.declines.append(decline)
        for name, model in chosen:
            applied._note(name, model, f"transformers {decline.version} has no {', '.join(decline.missing)}")
        return applied
    try:
        for name, model in chosen:
            if _uses_interface(model):
                applied.add(name, model, attention_fn)
            else:
                applied.own_code.append(f"{name or type(model).__name__} ({type(model).__name__})")
                applied._note(name, model, "its attention is its own code, not transformers' AttentionInterface")
    except BaseException:
        applied.restore()
        raise
    return applied


__all__ = [
    "AppliedTransformers",
    "PATH",
    "ROUTED",
    "SdpaToRoute",
    "TextModelState",
    "apply_to_transformers",
    "register",
    "registered",
    "routed_modules",
    "routed_sdpa",
    "text_models",
    "unregister",
]
