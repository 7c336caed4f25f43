"""Legacy attention: route diffusers <= 0.14-era attention code and diffusers' xformers switches through npu-port's
attention strategy, reversibly.

"Legacy" means the attention code CUDA video/diffusion projects copied from diffusers before processors existed
(diffusers <= 0.11 ``CrossAttention``; ControlVideo's ``FullyFrameAttention`` / ``IndividualAttention``, Tune-A-Video's
and AnimateDiff's attention classes): heads folded into the batch, ``(batch*heads, seq, head_dim)`` tensors, and one
method that does the whole computation — ``_attention(self, query, key, value, attention_mask=None)`` with ``baddbmm``
scores scaled by ``self.scale``, a softmax, a ``bmm``, and ``reshape_batch_dim_to_heads`` (which reads ``self.heads``)
on the way out. It materialises the ``(batch*heads, q_len, key_len)`` scores and probabilities (ControlVideo's 112.5 GiB
allocation), switches to ``xformers.ops`` behind ``_use_memory_efficient_attention_xformers``, and its
``set_use_memory_efficient_attention_xformers`` raises without CUDA.

* :func:`is_legacy_attention_class` — the contract, checked narrowly (exact parameter names, the ``heads`` / ``scale``
  attributes actually read): routing a method whose meaning we only guessed would change results silently.
  diffusers' current ``Attention`` has no ``_attention`` and never matches.
* :func:`patch_legacy_attention` — routed ``_attention`` / ``_sliced_attention`` and an exact ``get_attention_scores``
  on the class, xformers flags cleared, repo-local xformers setters made no-ops; :class:`LegacyPatch` undoes it.
* :func:`hook_enable_xformers` — diffusers' ``enable_xformers_memory_efficient_attention`` and friends install
  npu-port's strategy instead; :class:`XformersHook` undoes it.

Pinned old diffusers: 0.11's own ``CrossAttention`` has exactly this contract and is routed like a project's copy;
diffusers' ``AttentionBlock`` (0.11–0.16: the VAE's attention), which computes attention inline in ``forward``, is
routed by the same patches with an equivalent ``forward`` (:mod:`npu_port.integrations.attention_block`); 0.12–0.14's
processor-based ``CrossAttention`` takes the strategy like today's ``Attention`` (see the hook below).

The routed methods unfold ``(batch*heads, seq, dim)`` to ``(batch, heads, seq, dim)`` with ``self.heads``, turn the
legacy additive mask into the 4-D float mask SDPA takes (:func:`npu_port.masks.unfold_heads`), call
``npu_port.attention(..., scale=self.scale)`` — so the process-wide strategy (``set_attention_strategy("chunked")``,
``auto``, the Ascend ops) picks the kernel — and hand the result to the module's own ``reshape_batch_dim_to_heads``,
in the dtype the original returned.

Numerics, masks and the calls left to the original: :mod:`npu_port.integrations.folded` (shared with the diffusers
processors that compute attention through ``get_attention_scores``). A call outside the legacy forms goes to the
original method, unchanged, with a debug log line.

Importing this module imports neither diffusers nor the user's code.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import threading
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

import torch
from torch import Tensor, nn

from ..attn import masks
from ..weak import weak
from .attention_block import is_attention_block_class, routed_forward
from .folded import UNFIT, attend

__all__ = [
    "LegacyPatch",
    "XformersHook",
    "XformersRoute",
    "active_patches",
    "find_legacy_attention",
    "hook_enable_xformers",
    "hooked_routes",
    "is_legacy_attention_class",
    "patch_legacy_attention",
    "unhook_enable_xformers",
    "xformers_route",
]

logger = logging.getLogger("npu_port.legacy")
_MISSING = object()
_lock = threading.RLock()


# ---- the contract ----------------------------------------------------------------------------------------------------
#
# What counts as a legacy attention class, and where a target keeps its instances.

#: The legacy methods, with the parameters (after ``self``) each must have to be routed.
ATTENTION = ("_attention", ("query", "key", "value", "attention_mask"))
SLICED = ("_sliced_attention", ("query", "key", "value", "sequence_length", "dim", "attention_mask"))
SCORES = ("get_attention_scores", ("query", "key", "attention_mask"))
#: The per-module setter that old code calls to switch xformers on (and that raises without CUDA).
XFORMERS_SETTER = "set_use_memory_efficient_attention_xformers"
#: Where a setter is library code, not a repo-local copy (diffusers' own setters are handled by the xformers hook).
LIBRARY_PREFIXES = ("diffusers", "torch", "npu_port")

ORIGINAL = "__npu_port_original__"  # set on every function npu-port installs: the function it stands in for


def original_function(value: Any) -> Any:
    """The user's function behind one npu-port installed (or ``value`` itself)."""
    return getattr(value, ORIGINAL, value)


def code_names(fn: Any) -> FrozenSet[str]:
    """Global and attribute names a function's code (nested functions included) refers to."""
    names: Set[str] = set()
    stack = [getattr(fn, "__code__", None)]
    while stack:
        code = stack.pop()
        if isinstance(code, types.CodeType):
            names.update(code.co_names)
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(names)


def legacy_method(cls: type, method: Tuple[str, Tuple[str, ...]]) -> Optional[types.FunctionType]:
    """The user's function ``cls`` has for ``method`` if its parameters are exactly the legacy ones, else None.

    The last parameter (``attention_mask``) of ``_attention`` and ``get_attention_scores`` must default to None.
    """
    name, parameters = method
    fn = original_function(inspect.getattr_static(cls, name, None))
    if not isinstance(fn, types.FunctionType):
        return None
    params = list(inspect.signature(fn).parameters.values())
    if tuple(p.name for p in params[1:]) != parameters:
        return None
    if name != SLICED[0] and params[-1].default is not None:
        return None
    return fn


def is_legacy_attention_class(cls: Any) -> bool:
    """True for a ``torch.nn.Module`` class with the legacy ``_attention(query, key, value, attention_mask=None)``
    contract: that method, ``reshape_batch_dim_to_heads``, and code that reads ``heads`` and ``scale``."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        return False
    attention = legacy_method(cls, ATTENTION)
    reshape = inspect.getattr_static(cls, "reshape_batch_dim_to_heads", None)
    if attention is None or not isinstance(reshape, types.FunctionType):
        return False
    used = code_names(attention) | code_names(reshape)
    scores = legacy_method(cls, SCORES)
    if scores is not None:  # some copies read self.scale there and call it from _attention
        used |= code_names(scores)
    return {"heads", "scale"} <= used


def repo_xformers_setter(cls: type) -> Optional[type]:
    """The class in ``cls``'s MRO defining a repo-local ``set_use_memory_efficient_attention_xformers`` (the copies
    that check for CUDA and xformers, and raise here), or None when there is none or it is library code."""
    for klass in inspect.getmro(cls):
        if XFORMERS_SETTER in vars(klass):
            return None if klass.__module__.split(".")[0] in LIBRARY_PREFIXES else klass
    return None


def target_modules(target: Any) -> Iterator[Tuple[str, nn.Module]]:
    """``(name, module)`` for every module in a module, or in each ``torch.nn.Module`` component of a pipeline
    (anything with a ``components`` dict); each module once."""
    if isinstance(target, nn.Module):
        roots: List[Tuple[str, nn.Module]] = [("", target)]
    elif isinstance(getattr(target, "components", None), dict):
        roots = [(n, m) for n, m in target.components.items() if isinstance(m, nn.Module)]
    else:
        raise TypeError(
            "patch_legacy_attention expects a torch.nn.Module, a diffusers pipeline, or a legacy attention class; "
            f"got {type(target).__module__}.{type(target).__qualname__}"
        )
    seen: Set[int] = set()
    for prefix, root in roots:
        for name, module in root.named_modules():
            if id(module) not in seen:
                seen.add(id(module))
                yield ".".join(p for p in (prefix, name) if p), module


def is_routable_class(cls: Any) -> bool:
    """A legacy attention class, or diffusers' ``AttentionBlock`` (0.11-0.16) keeping its own ``forward``."""
    return is_legacy_attention_class(cls) or is_attention_block_class(cls)


def find_legacy_attention(target: Any) -> List[Tuple[str, nn.Module]]:
    """Every legacy attention module in ``target`` (a module or a pipeline), as ``(qualified name, module)``:
    legacy ``_attention`` classes and diffusers' ``AttentionBlock``."""
    return [(name, m) for name, m in target_modules(target) if is_routable_class(type(m))]


# ---- the routed methods ----------------------------------------------------------------------------------------------
#
# What is installed on a legacy class: the same contract, computed by npu_port.attention (see the module docstring).

_UNFIT = UNFIT  # a call the routed methods leave to the original


def _mark(routed: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(routed, original)
    routed.__npu_port_original__ = original  # type: ignore[attr-defined]
    return routed


def _fall_back(module: Any, name: str) -> None:
    logger.debug("npu-port: %s.%s call left to the original (not a legacy form)", type(module).__name__, name)


def routed_attention(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``_attention(self, query, key, value, attention_mask=None)``: ``(batch, q_len, heads*dim)`` in the value's
    dtype, as the original returns it."""

    def _attention(self, query, key, value, attention_mask=None):
        out = attend(self, query, key, value, attention_mask)
        if out is _UNFIT:
            _fall_back(self, "_attention")
            return original(self, query, key, value, attention_mask)
        return self.reshape_batch_dim_to_heads(out.to(value.dtype))

    return _mark(_attention, original)


def routed_sliced_attention(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``_sliced_attention(self, query, key, value, sequence_length, dim, attention_mask)``: the same result as the
    original's loop over ``self._slice_size`` rows of ``batch*heads`` (whose memory bound the strategy now gives),
    in the query's dtype — rows past the last whole slice stay zero, as they do there."""

    def _sliced_attention(self, query, key, value, sequence_length, dim, attention_mask):
        batch_heads = query.shape[0] if isinstance(query, Tensor) and query.dim() == 3 else 0
        slice_size = getattr(self, "_slice_size", None)
        slice_size = batch_heads if slice_size is None else slice_size
        fits = (
            batch_heads
            and isinstance(slice_size, int)
            and slice_size >= 1
            and sequence_length == query.shape[1]
            and dim // self.heads == value.shape[-1]
        )
        out = attend(self, query, key, value, attention_mask) if fits else _UNFIT
        if out is _UNFIT:
            _fall_back(self, "_sliced_attention")
            return original(self, query, key, value, sequence_length, dim, attention_mask)
        out = out.to(query.dtype)
        covered = batch_heads // slice_size * slice_size
        if covered < batch_heads:
            out[covered:] = 0
        return self.reshape_batch_dim_to_heads(out)

    return _mark(_sliced_attention, original)


def exact_attention_scores(original: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``get_attention_scores(self, query, key, attention_mask=None)``: still the probabilities (its callers
    multiply them by the values themselves), computed as the original does, with two fixes: the mask is added in
    the scores' dtype (the original's ``baddbmm(mask, ...)`` fails for a half mask under ``upcast_attention``), and
    a row whose keys are all masked gives zeros, not NaN."""

    def get_attention_scores(self, query, key, attention_mask=None):
        if attention_mask is not None and (
            not isinstance(attention_mask, Tensor) or not attention_mask.dtype.is_floating_point
        ):
            _fall_back(self, "get_attention_scores")
            return original(self, query, key, attention_mask)
        dtype = query.dtype
        if self.upcast_attention:
            query, key = query.float(), key.float()
        scores = torch.bmm(query, key.transpose(-1, -2)) * self.scale
        if attention_mask is not None:
            scores = scores + attention_mask.to(scores.dtype)
        if self.upcast_softmax:
            scores = scores.float()
        probs = scores.softmax(dim=-1)
        if attention_mask is not None:
            dead = ~masks.keep_from_additive(attention_mask).any(dim=-1, keepdim=True)
            probs = probs.masked_fill(dead, 0.0)
        return probs.to(dtype)

    return _mark(get_attention_scores, original)


def ignored_xformers_setter(cls: type, original: Callable[..., Any]) -> Callable[..., None]:
    """A ``set_use_memory_efficient_attention_xformers`` that does nothing but say so, once per class."""
    said = []

    def set_use_memory_efficient_attention_xformers(self, *args: Any, **kwargs: Any) -> None:
        if not said:
            said.append(True)
            logger.warning(
                "npu-port: %s.set_use_memory_efficient_attention_xformers ignored; "
                "attention runs through npu-port's strategy",
                cls.__name__,
            )

    return _mark(set_use_memory_efficient_attention_xformers, original)


# ---- patching classes and instances ----------------------------------------------------------------------------------
#
# Methods are replaced on the *class* (the class of each module found, or the class given), so every instance — those
# in the target and those built later — takes the routed path. Patches are shared and counted: a class patched by two
# handles keeps its routed methods until both are restored, and a method goes back only if it is still ours (if
# someone replaced it since, theirs stays). Per instance, ``_use_memory_efficient_attention_xformers`` is cleared so
# ``forward`` takes the ``_attention`` path instead of importing xformers; restore sets back the flags that were set.

_FLAG = "_use_memory_efficient_attention_xformers"


class _MethodPatch:
    """One method replaced on one class; ``users`` handles hold it."""

    __slots__ = ("cls", "name", "saved", "installed", "users")

    def __init__(self, cls: type, name: str, installed: Callable[..., Any]) -> None:
        self.cls, self.name, self.installed, self.users = cls, name, installed, 0
        self.saved = vars(cls).get(name, _MISSING)  # what the class itself had (inherited: nothing to put back)

    def put_back(self) -> None:
        if vars(self.cls).get(self.name, _MISSING) is not self.installed:
            return  # replaced by someone else since: theirs stays
        if self.saved is _MISSING:
            delattr(self.cls, self.name)
        else:
            setattr(self.cls, self.name, self.saved)


#: (class, method name) -> the live patch.
_PATCHES: Dict[Tuple[type, str], _MethodPatch] = {}


def active_patches() -> List[str]:
    """``Class.method`` for every method patched right now (for tests and ``explain``)."""
    with _lock:
        return sorted(f"{cls.__qualname__}.{name}" for cls, name in _PATCHES)


def _replacements(cls: type) -> List[Tuple[str, Callable[..., Any]]]:
    """The routed methods for a legacy attention class: ``_attention`` always, its siblings when they are legacy;
    for diffusers' ``AttentionBlock``, ``forward``."""
    if is_attention_block_class(cls):
        return [("forward", routed_forward(original_function(inspect.getattr_static(cls, "forward"))))]
    builders = (
        (ATTENTION, routed_attention),
        (SLICED, routed_sliced_attention),
        (SCORES, exact_attention_scores),
    )
    found = []
    for method, build in builders:
        original = legacy_method(cls, method)
        if original is not None:
            found.append((method[0], build(original)))
    return found


class LegacyPatch:
    """What one :func:`patch_legacy_attention` call did; :meth:`restore` undoes it (idempotent).

    ``classes``: names of the legacy attention classes routed; ``setters``: classes whose xformers setter was
    made a no-op; ``instances``: legacy attention modules found in the target; ``flags_cleared``: how many of them
    had xformers switched on. Also a context manager.
    """

    def __init__(self, target: Any) -> None:
        self._target = weak(target)  # never keeps the user's model alive (npu_port.weak)
        self.classes: List[str] = []
        self.setters: List[str] = []
        self.instances = 0
        self._held: List[Tuple[type, str]] = []
        self._flags: List[Tuple[Callable[[], Optional[nn.Module]], Any]] = []
        self.restored = False

    @property
    def target(self) -> Any:
        """What was patched (a class, a module or a pipeline), or None once the user's object is gone."""
        return self._target()

    @property
    def flags_cleared(self) -> int:
        return len(self._flags)

    def _install(self, cls: type, name: str, replacement: Callable[..., Any]) -> None:
        key = (cls, name)
        with _lock:
            if key in self._held:
                return
            patch = _PATCHES.get(key)
            if patch is None or vars(cls).get(name, _MISSING) is not patch.installed:
                patch = _PATCHES[key] = _MethodPatch(cls, name, replacement)
                setattr(cls, name, replacement)
            patch.users += 1
            self._held.append(key)

    def _route_class(self, cls: type) -> None:
        if (cls, ATTENTION[0]) in self._held or (cls, "forward") in self._held:
            return
        for name, replacement in _replacements(cls):
            self._install(cls, name, replacement)
        self.classes.append(cls.__qualname__)

    def _quiet_setter(self, cls: type) -> None:
        defining = repo_xformers_setter(cls)
        if defining is None or (cls, XFORMERS_SETTER) in self._held:
            return
        original = original_function(vars(defining)[XFORMERS_SETTER])
        self._install(cls, XFORMERS_SETTER, ignored_xformers_setter(cls, original))
        self.setters.append(cls.__qualname__)

    def _clear_flag(self, module: nn.Module) -> None:
        value = vars(module).get(_FLAG, _MISSING)
        if value is not _MISSING and value:
            self._flags.append((weak(module), value))
            setattr(module, _FLAG, False)

    def restore(self) -> None:
        """Put back the original functions (the very same objects) and the xformers flags. Idempotent."""
        if self.restored:
            return
        self.restored = True
        for module_ref, value in reversed(self._flags):
            module = module_ref()
            if module is not None and vars(module).get(_FLAG, _MISSING) is False:
                setattr(module, _FLAG, value)
        self._flags.clear()
        with _lock:
            for key in reversed(self._held):
                patch = _PATCHES.get(key)
                if patch is None:
                    continue
                patch.users -= 1
                if patch.users <= 0:
                    del _PATCHES[key]
                    patch.put_back()
            self._held.clear()

    def __enter__(self) -> "LegacyPatch":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "restored" if self.restored else "active"
        return f"<LegacyPatch {', '.join(self.classes) or 'nothing'}: {self.instances} instances; {state}>"


def patch_legacy_attention(target: Any) -> LegacyPatch:
    """Route the legacy attention in ``target`` through ``npu_port.attention`` (the active strategy); undo with
    ``.restore()``.

    ``target``: a legacy attention class, a ``torch.nn.Module`` (every submodule is searched) or a diffusers
    pipeline (its module components). Each legacy class found gets routed ``_attention`` (and ``_sliced_attention``,
    ``get_attention_scores`` when it has them), diffusers' ``AttentionBlock`` (0.11-0.16) a routed ``forward``
    (:mod:`.attention_block`); every instance gets its xformers flag cleared; a repo-local
    ``set_use_memory_efficient_attention_xformers`` (the copies that raise without CUDA), on the attention class or
    on a block holding one, becomes a no-op that logs one line: what it would switch on is routed now.

    Raises :class:`ValueError` when ``target`` holds no legacy attention (a silently ignored target looks exactly
    like a working one), :class:`TypeError` for a target of another kind.
    """
    patch = LegacyPatch(target)
    try:
        if isinstance(target, type):
            if not is_routable_class(target):
                raise ValueError(
                    f"{target.__module__}.{target.__qualname__} is not a legacy attention class: it needs "
                    "_attention(self, query, key, value, attention_mask=None), reshape_batch_dim_to_heads, and "
                    "code that reads self.heads and self.scale (or must be diffusers' AttentionBlock)"
                )
            patch._route_class(target)
            patch._quiet_setter(target)
            return patch
        found = find_legacy_attention(target)
        if not found:
            raise ValueError(
                f"{type(target).__name__} contains no legacy attention module (a class with "
                "_attention(self, query, key, value, attention_mask=None) using self.heads and self.scale, "
                "or diffusers' AttentionBlock)"
            )
        legacy_classes = {type(m) for _, m in found}
        for _, module in found:
            patch._route_class(type(module))
            patch._clear_flag(module)
        patch.instances = len(found)
        for _, module in target_modules(target):  # blocks whose setter guards legacy attention
            cls = type(module)
            if repo_xformers_setter(cls) is not None and any(type(m) in legacy_classes for m in module.modules()):
                patch._quiet_setter(cls)
    except BaseException:
        patch.restore()
        raise
    return patch


# ---- diffusers' xformers switches ------------------------------------------------------------------------------------
#
# CUDA-era scripts call ``pipe.enable_xformers_memory_efficient_attention()`` (or the model's, or
# ``set_use_memory_efficient_attention_xformers(True)``). Without CUDA and xformers that raises — in diffusers'
# ``Attention`` or in a project's copy of the setter — and where it works it pins one kernel. While the hook is on,
# these three methods of diffusers' ``DiffusionPipeline`` and ``ModelMixin`` do instead:
#
# * enable: apply a strategy to the object — ``set_attention_strategy(strategy, target=self)`` for its diffusers
#   attention modules, ``patch_legacy_attention`` for its legacy ones — where ``strategy`` is the hook's, else the
#   process-wide active one, else "auto"; ``attention_op`` is ignored; one log line says what was installed;
# * disable (or ``set_use...(False)``): restore what enable installed on that object (the very processor objects and
#   functions); on an object enable never touched, diffusers' own code runs.
#
# ``XformersHook.restore()`` (or calling the hook) restores every route still installed and puts diffusers' methods
# back — the same function objects.

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
    """diffusers' ``ModelMixin`` and ``DiffusionPipeline``; none when diffusers cannot be imported (nothing to hook)."""
    try:
        from diffusers import DiffusionPipeline, ModelMixin
    except Exception as exc:  # missing, or broken by an optional dependency (torch_npu without CANN)
        logger.debug("npu-port: diffusers not importable (%s); its xformers switches are not hooked", exc)
        return []
    return [ModelMixin, DiffusionPipeline]


def _has_diffusers_attention(target: Any) -> bool:
    from .diffusers import classes
    from .diffusers.targets import attention_modules

    try:
        attention_modules(target, classes.load())
    except ValueError:
        return False
    return True


def _active_strategy() -> Any:
    from ..strategy.process import STATE

    return STATE.active[-1].strategy if STATE.active else None


def _describe(route: XformersRoute) -> str:
    parts = []
    if route.strategy is not None:
        parts.append(f"npu-port attention strategy {route.strategy.strategy.name!r}")
    if route.legacy is not None:
        active = _active_strategy()
        how = f"strategy {active.name!r}" if active is not None else "npu_port.attention's default kernel order"
        parts.append(f"legacy attention {', '.join(route.legacy.classes)} routed (process-wide {how})")
    return " and ".join(parts) or "nothing (no diffusers or legacy attention module found)"


class XformersHook:
    """diffusers' xformers switches, hooked (see the section comment above). ``restore()`` or ``hook()`` unhooks."""

    def __init__(self, strategy: Any = None) -> None:
        self.strategy = strategy
        self.patched: List[Tuple[type, str, Any, Callable[..., Any]]] = []  # (class, name, saved, installed)
        self.routes: "weakref.WeakKeyDictionary[Any, XformersRoute]" = weakref.WeakKeyDictionary()
        #: what enable installed, for npu-port run's summary, kept when the object is freed (a script's pipeline
        #: is gone by exit): the object's class name, the description and the router that counts its calls — no
        #: processors, no model. Bounded: a server enabling per request keeps the latest entries.
        self.history: "collections.deque[Tuple[str, str, Any]]" = collections.deque(maxlen=HISTORY)
        #: every legacy patch enable made (class-level, holding no model), undone by restore() even for objects
        #: freed meanwhile.
        self._legacy: List[LegacyPatch] = []
        self.restored = False

    # ---- what the hooked methods do ---------------------------------------------------------------------------

    def enable(self, obj: Any, attention_op: Any = None) -> XformersRoute:
        """Apply the strategy to ``obj`` (once; a second enable keeps the first route)."""
        with _lock:
            route = self.routes.get(obj)
            if route is not None:
                return route
            strategy = self.strategy or _active_strategy() or "auto"
            route = XformersRoute()
            try:
                if find_legacy_attention(obj):
                    route.legacy = patch_legacy_attention(obj)
                if _has_diffusers_attention(obj):
                    from ..strategy.api import set_attention_strategy

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
        with _lock:
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

        def disable_xformers_memory_efficient_attention(self):
            hook.disable(self, original_setter)

        def set_use_memory_efficient_attention_xformers(self, valid, attention_op=None):
            if valid:
                hook.enable(self, attention_op)
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
                self.patched.append((cls, name, vars(cls).get(name, _MISSING), fn))
                setattr(cls, name, fn)
        return self

    def restore(self) -> None:
        """Restore every route still installed, then put diffusers' methods back (if still ours). Idempotent."""
        global _HOOK
        if self.restored:
            return
        self.restored = True
        with _lock:
            routes: List[Any] = list(self.routes.values()) + self._legacy  # legacy class patches of freed objects too
            self.routes.clear()
            self._legacy.clear()
            for cls, name, saved, installed in reversed(self.patched):
                if vars(cls).get(name, _MISSING) is not installed:
                    continue
                if saved is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, saved)
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
    with _lock:
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


def xformers_route(obj: Any) -> Optional[XformersRoute]:
    """What the hooked enable installed on ``obj`` (None when nothing)."""
    return _HOOK.routes.get(obj) if _HOOK is not None else None
