"""Reversible, reference-counted patches of the module globals through which kept processors reach attention.

A kept processor computes attention by calling a global of the module that defines it: ``F`` (=
``torch.nn.functional``) for ``F.scaled_dot_product_attention``, or ``dispatch_attention_fn`` imported from
``diffusers.models.attention_dispatch``. We replace those globals — only in the modules that use them, never
``torch.nn.functional`` itself — with stand-ins that consult :mod:`.routing`: inside a targeted module the call goes
to its route's attention function, anywhere else to the original, with the caller's arguments untouched. So other
models, and code outside diffusers, see no change at all.

Patches are shared: each (module, global) is patched once however many applications need it, counted, and put back
when the last :class:`PatchLease` holding it is released — and only if the global is still our stand-in (if
someone replaced it since, theirs stays). The module of diffusers' dispatcher (the backends themselves) and npu-port's
own modules are never patched: the kernels call the real SDPA.

Processors that reach no such global get their class's ``__call__`` routed in place, by the same counted, reversible
patches (:class:`PatchLease.cover_processor`): the ones that compute attention through ``get_attention_scores`` and
``torch.bmm`` are recompiled with that pair routed (:mod:`.scores`), and the standard processors that cannot run off
their device (xformers, NPU) run our processor's steps with the module's route. Outside a targeted module both are
the original code. Instances keep their identity and type: ``type(proc) is AttnProcessor`` stays true.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as real_functional

from ... import _patching
from ...upstream.diffusers import attention as upstream
from ..code_names import names_used_by, names_used_by_class
from .routing import current_route
from .scores import rewrite_call
from .stand_ins import ROUTED_FUNCTIONAL, SDPA, routed_dispatch, routed_scaled_dot_product_attention

_NEVER_PATCHED = ("npu_port", "torch")
#: The keys of this module's patches in :mod:`npu_port._patching`: module globals, and processor classes' methods.
GLOBAL_KEY = "diffusers:global"
CLASS_KEY = "diffusers:processor"

_lock = _patching.LOCK


def _patchable(module_name: str) -> bool:
    if any(module_name == p or module_name.startswith(p + ".") for p in _NEVER_PATCHED):
        return False
    return not upstream.is_dispatch_module(module_name)


# ---- the shared, counted patches ---------------------------------------------------------------------------------


#: id(original dispatch_attention_fn) -> its router (one per original, shared by every lease).
_ROUTERS: Dict[int, Callable[..., Any]] = {}


def _router_for(original: Callable[..., Any]) -> Callable[..., Any]:
    router = _ROUTERS.get(id(original))
    if router is None or router.__npu_port_original__ is not original:  # type: ignore[attr-defined]
        router = _ROUTERS[id(original)] = routed_dispatch(original)
    return router


def active_patches() -> List[Tuple[str, str]]:
    """``(module, global)`` pairs patched right now, and ``(module, Class.__call__)`` for processor classes routed
    in place (for ``explain`` and tests)."""
    found = []
    for patch in _patching.active(lambda key: key in (GLOBAL_KEY, CLASS_KEY)):
        if patch.key == GLOBAL_KEY:
            found.append((patch.owner.__name__, patch.name))
        else:
            found.append((patch.owner.__module__, f"{patch.owner.__qualname__}.{patch.name}"))
    return sorted(found)


# ---- processor classes routed in place -------------------------------------------------------------------------

#: What ``explain`` says of a linear-attention processor.
LINEAR_ATTENTION = "linear attention (not softmax attention): nothing to route"
#: What ``explain`` says of a processor that calls diffusers' dispatcher when the adapter could not find it.
DISPATCH_DECLINED = (
    f"calls {upstream.DISPATCH_NAME}, which npu-port could not find in this diffusers (declined): diffusers' own "
    "dispatcher runs, not routed"
)


def calls_dispatcher(cls: type) -> bool:
    """Whether a processor class's code (its own or a base's) calls diffusers' dispatcher by its name."""
    return any(
        upstream.DISPATCH_NAME in names_used_by_class(klass)
        for klass in inspect.getmro(cls)
        if klass not in (object, torch.nn.Module)
    )


def _call_owner(cls: type) -> Optional[Tuple[type, str]]:
    """The class in ``cls``'s MRO that defines the method its instances run when called, and its name: ``__call__``,
    or ``forward`` for a ``torch.nn.Module`` processor that only defines that. None: nothing of the user's."""
    for method in ("__call__", "forward"):
        for klass in inspect.getmro(cls):
            if method in vars(klass):
                if klass.__module__ == "builtins" or klass.__module__.startswith("torch."):
                    break  # torch's own __call__ runs forward: look for that instead
                return klass, method
    return None


def _standard_call(original: Callable[..., Any], stands_in_for: type) -> Callable[..., Any]:
    """``__call__`` of a standard processor that cannot run off its device (xformers, NPU): inside a targeted module,
    the steps of our processor standing in for ``stands_in_for``, with the module's route; elsewhere the original."""
    from .processor import RoutedAttnProcessor

    def unused(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - run() is always given the module's route
        raise AssertionError("the stand-in's own route is never used")

    stand_in = RoutedAttnProcessor(unused, stands_in_for)

    @functools.wraps(original)
    def __call__(self: Any, attn: Any, *args: Any, **kwargs: Any) -> Any:
        route = current_route()
        if route is None or upstream.missing_steps(attn):  # not routed here, or not a module our steps can read
            return original(self, attn, *args, **kwargs)
        return stand_in.run(route, attn, *args, **kwargs)

    __call__.__npu_port_original__ = original  # type: ignore[attr-defined]
    return __call__


def is_linear_attention(cls: type) -> bool:
    """diffusers' linear-attention processors (Sana's ``*LinearAttnProcessor*``, the DC-AE's multiscale one): ReLU
    feature maps and matmuls, no softmax — not SDPA's computation, so no kernel of ours may stand in for it."""
    return any(
        upstream.is_diffusers_class(klass)
        and ("LinearAttnProcessor" in klass.__name__ or klass.__name__.startswith("SanaMultiscaleAttnProcessor"))
        for klass in inspect.getmro(cls)
    )


def _unroutable(cls: type, why: str) -> str:
    """Why a processor class's attention cannot be routed, from what its ``__call__`` refers to."""
    if why:
        return why
    found = _call_owner(cls)
    names = names_used_by_class(found[0]) if found is not None else frozenset()
    if "memory_efficient_attention" in names:
        return (
            "calls xformers directly (under npu-port run the xformers drop-in routes it with the process-wide strategy)"
        )
    if names & {"npu_fusion_attention", "npu_fused_infer_attention_score", "npu_prompt_flash_attention"}:
        return "calls torch_npu's attention ops directly"
    if "baddbmm" in names or ("softmax" in names and names & {"bmm", "matmul", "einsum"}):
        return "computes attention inline (baddbmm / matmul + softmax), not through a call npu-port can route"
    return "its code calls neither SDPA, dispatch_attention_fn nor get_attention_scores -> torch.bmm"


class PatchLease:
    """The patches one application holds; :meth:`release` gives them back (idempotent).

    :meth:`cover` patches what one module needs; :meth:`routes` tells whether a processor class's code reaches a
    patched global (so ``explain`` can say "routed" only where calls really are).
    """

    def __init__(
        self, dispatch_original: Optional[Callable[..., Any]], stand_ins: Optional[Dict[type, type]] = None
    ) -> None:
        self._dispatch_original = dispatch_original
        self._stand_ins = dict(stand_ins or {})  # broken-off-device standard class -> the class we stand in for
        #: (module name, global) -> the patch this lease holds, in the order taken.
        self._held: Dict[Tuple[str, str], _patching.Patch] = {}
        #: (class, method) -> the in-place patch of a processor class this lease holds, in the order taken.
        self._classes: Dict[Tuple[type, str], _patching.Patch] = {}
        self._unroutable: Dict[type, str] = {}  # processor class -> why its attention is not routed
        self._released = False

    def _replacement_for(self, value: Any, module: types.ModuleType) -> Optional[Any]:
        if value is real_functional:
            return ROUTED_FUNCTIONAL if SDPA in names_used_by(module) else None
        if value is real_functional.scaled_dot_product_attention:
            return routed_scaled_dot_product_attention
        if self._dispatch_original is not None and value is self._dispatch_original:
            return _router_for(self._dispatch_original)
        return None

    def cover(self, module: Optional[types.ModuleType]) -> None:
        """Patch the globals through which code in ``module`` calls SDPA or the dispatcher (or join existing ones)."""
        if self._released:
            raise RuntimeError("this patch lease was released")
        name = getattr(module, "__name__", None)
        if not isinstance(module, types.ModuleType) or not isinstance(name, str) or not _patchable(name):
            return
        with _lock:
            for global_name in list(vars(module)):
                if (name, global_name) in self._held:
                    continue
                # someone replaced our stand-in since: acquire gives None, theirs stays, unrouted
                patch = _patching.acquire(
                    module, global_name, lambda value: self._replacement_for(value, module), key=GLOBAL_KEY
                )
                if patch is not None:
                    self._held[(name, global_name)] = patch

    def cover_loaded_diffusers(self) -> None:
        """Patch every loaded diffusers module that calls SDPA or the dispatcher."""
        for module in upstream.loaded_modules():
            self.cover(module)

    def dispatch_declined(self, cls: type) -> bool:
        """Whether a processor of class ``cls`` calls diffusers' dispatcher and the adapter could not find it (the
        dispatcher declined): it stays on diffusers' own path — no patch, no route hooks on its modules."""
        return self._dispatch_original is None and calls_dispatcher(cls)

    def cover_processor(self, cls: type) -> None:
        """Route what a processor of class ``cls`` computes: the globals its modules' code calls SDPA or the
        dispatcher through, and — when those are not how it reaches attention — its ``__call__`` in place."""
        if self._released:
            raise RuntimeError("this patch lease was released")
        if self.dispatch_declined(cls):
            return
        for name in sorted({k.__module__ for k in inspect.getmro(cls) if k not in (object, torch.nn.Module)}):
            self.cover(sys.modules.get(name))
        with _lock:
            found = _call_owner(cls)
            if found is None or found in self._classes or is_linear_attention(cls):
                return
            owner, method = found
            live = _patching.find(owner, method, CLASS_KEY)
            if live is not None:
                if live.live:
                    self._classes[found] = _patching.hold(live)
                return  # replaced by someone else since ours: theirs stays, unrouted
            original = vars(owner)[method]
            stands_in_for = self._stand_ins.get(owner)
            if stands_in_for is not None:  # before the globals: AttnProcessorNPU calls SDPA for float32 only
                replacement: Any = _standard_call(original, stands_in_for)
                how = f"runs {stands_in_for.__name__}'s steps with the attention core routed"
            elif self._routes_globally(cls):
                return
            else:
                replacement, how = rewrite_call(original)
                if replacement is None:
                    if how != "no get_attention_scores call":
                        self._unroutable[cls] = how
                    return
            patch = _patching.replace(owner, method, replacement, key=CLASS_KEY)
            patch.note = how
            self._classes[found] = patch

    def explain(self, cls: type) -> Tuple[str, str]:
        """``("routed", how)``, ``("linear", why)`` or ``("kept", why not)`` for a processor class covered here."""
        with _lock:
            found = _call_owner(cls)
            if found in self._classes:
                return "routed", self._classes[found].note or "routed in place"
        if is_linear_attention(cls):
            return "linear", LINEAR_ATTENTION
        if self.dispatch_declined(cls):
            return "kept", DISPATCH_DECLINED
        if self.routes(cls):
            return "routed", "its F.scaled_dot_product_attention / dispatch_attention_fn call is routed"
        return "kept", _unroutable(cls, self._unroutable.get(cls, ""))

    def routes(self, cls: type) -> bool:
        """Whether a processor of class ``cls`` is routed here: its ``__call__`` in place, or methods of ``cls`` (or
        its bases) calling SDPA or the dispatcher through a global patched here."""
        with _lock:
            if _call_owner(cls) in self._classes:
                return True
        return self._routes_globally(cls)

    def _routes_globally(self, cls: type) -> bool:
        with _lock:
            for klass in inspect.getmro(cls):
                if klass in (object, torch.nn.Module):
                    continue
                names = names_used_by_class(klass)
                for (module_name, global_name), patch in self._held.items():
                    if module_name != klass.__module__ or global_name not in names:
                        continue
                    if patch.replacement is not ROUTED_FUNCTIONAL or SDPA in names:
                        return True
        return False

    def release(self) -> None:
        """Give back this lease's patches; a global goes back to its original when its last user releases it."""
        if self._released:
            return
        self._released = True
        with _lock:
            for patch in reversed(list(self._held.values())):
                _patching.release(patch)
            for patch in reversed(list(self._classes.values())):
                _patching.release(patch)
            self._held.clear()
            self._classes.clear()
