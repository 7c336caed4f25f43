"""The record of one application: what changed where, how many calls went through, and how to undo it all.

Restoring must give back the very processor objects that were there (processors can carry trained weights and
user state), remove every hook, and release the shared patches, so the model computes bit-for-bit what it did
before. Undo steps are recorded *before* each change is made, which is what lets a failure half-way through
``apply_to_target`` be undone with the same :meth:`AppliedAttention.restore`.

Restore undoes what the application did and nothing else: a module whose processor was changed by someone else
since (IP-Adapter loading, ``set_attention_slice``, ``set_default_attn_processor``) keeps that newer processor —
putting the old one back would, for instance, leave an IP-Adapter's image projection feeding tuples to a processor
that cannot read them. Such modules are listed in ``AppliedAttention.left_alone``.

Nothing here keeps the model alive (:mod:`npu_port.weak`): modules, the target and the module tables are held
weakly, so a model dropped without ``restore()`` is freed, and when the last of its attention modules goes, the
application releases what it shares with others (the module-global and processor-class patches) by itself.

What ``describe()`` reports is the state *now*, read from each module's current processor: a processor set after
the strategy was applied (``set_default_attn_processor``, attention slicing, IP-Adapter loading) is shown as what it
is — routed, linear attention, or kept and not routed with the reason — never as the processor we installed.

Applications on one model stack, and their handles may be restored in any order. Each processor an application
installs is a *layer* of its module, kept in one table for every application: when an application is restored while
a newer one sits on top of its processor, nothing on the module changes, but the newer layer takes over the older
one's original, so whichever is restored last puts back the processor that was there before either — never
npu-port's own processor left behind.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from torch import nn
from torch.utils.hooks import RemovableHandle

from ...weak import weak
from .patches import PatchLease
from .routing import Tally

#: What happened to each attention module, in the order ``counts()`` reports them.
ACTIONS = ("replaced", "routed", "linear", "kept", "custom")

ACTION_MEANINGS = {
    "replaced": "standard processor replaced by npu-port's (attention core routed)",
    "routed": "processor kept; its attention core is routed",
    "linear": "linear attention (not softmax attention): nothing to route",
    "kept": "processor kept, NOT routed: it computes attention itself",
    "custom": "custom processor installed",
    "freed": "module freed",
}


class ModuleChange(NamedTuple):
    """One attention module: qualified name, class name of the processor it had, and the action taken."""

    name: str
    original: str
    action: str


class ModuleState(NamedTuple):
    """One attention module now: qualified name, class name of its current processor, its state (an action of
    :data:`ACTIONS`, or ``"freed"``) and what that means for it (how it is routed, or why it is not)."""

    name: str
    processor: str
    state: str
    detail: str


def put_processor(module: nn.Module, processor: Any) -> None:
    """Set a processor without going through a possibly overridden ``set_processor``: the undo path of last resort.

    Mirrors diffusers' ``set_processor``: an ``nn.Module`` processor is dropped from ``_modules`` when replaced by a
    plain one (``nn.Module.__setattr__`` refuses that assignment otherwise).
    """
    if isinstance(getattr(module, "processor", None), nn.Module) and not isinstance(processor, nn.Module):
        module._modules.pop("processor", None)
    module.processor = processor


class ProcessorLayer:
    """A processor an application installed on a module, and what to put back when it goes (``original``: updated
    when an older application under this one is restored first). The module is held weakly."""

    __slots__ = ("name", "_module", "original", "installed", "__weakref__")

    def __init__(self, name: str, module: nn.Module, original: Any, installed: Any) -> None:
        self.name = name
        self._module = weakref.ref(module)
        self.original = original
        self.installed = installed

    @property
    def module(self) -> Optional[nn.Module]:
        return self._module()


_layers_lock = threading.RLock()
#: module -> weak references to the layers of every active application on it, oldest first. Both sides weak: a layer
#: holds the processors to put back, and a processor may hold its module (``self.attn = attn``), so a table holding
#: layers would keep a dropped model alive; the layers belong to their application (the user's handle).
_LAYERS: "weakref.WeakKeyDictionary[nn.Module, List[weakref.ref[ProcessorLayer]]]" = weakref.WeakKeyDictionary()


def _add_layer(layer: ProcessorLayer, module: nn.Module) -> None:
    with _layers_lock:
        _LAYERS.setdefault(module, []).append(weakref.ref(layer))


def _live_layers(module: nn.Module) -> List[ProcessorLayer]:
    refs = _LAYERS.get(module, [])
    return [layer for layer in (ref() for ref in refs) if layer is not None]


def layered_modules() -> int:
    """Modules with an active layer right now (for tests: it must not grow with models that are gone)."""
    with _layers_lock:
        return sum(1 for module in list(_LAYERS.keys()) if _live_layers(module))


def _take_layer(layer: ProcessorLayer) -> Optional[ProcessorLayer]:
    """Remove ``layer`` from its module's table; the newer layer stacked on it (installed over its processor), to
    which its original is handed down, or None when it is the top one (or the module is gone)."""
    module = layer.module
    if module is None:
        return None
    with _layers_lock:
        stack = [other for other in _live_layers(module) if other is not layer]
        if stack:
            _LAYERS[module] = [weakref.ref(other) for other in stack]
        else:
            _LAYERS.pop(module, None)
        above = next((other for other in stack if other.original is layer.installed), None)
        if above is not None:
            above.original = layer.original
        return above


class Routing:
    """What keeps routing a model while it lives — its modules' hooks, the shared patches, how many of its modules are
    alive, whether it was restored — and nothing of the user's: the ``set_processor`` watchers and the modules'
    finalizers hold this, never the :class:`AppliedAttention` with its processors, so they cannot keep a model alive
    (a processor may refer to its own module)."""

    __slots__ = ("tally", "hooks", "lease", "legacy", "live", "restored")

    def __init__(self) -> None:
        self.tally = Tally()
        self.hooks: Dict[str, List[RemovableHandle]] = {}  # module name -> its routing hooks
        self.lease: Optional[PatchLease] = None
        self.legacy: Any = None  # the LegacyPatch of the target's legacy attention classes, if it has any
        self.live = 0
        self.restored = False

    def set_hooks(self, name: str, handles: List[RemovableHandle]) -> None:
        self.hooks[name] = handles

    def drop_hooks(self, name: str) -> None:
        for handle in self.hooks.pop(name, ()):
            handle.remove()

    def module_freed(self) -> None:
        """A finalizer: one of the modules is gone. With the last one, release what is shared with others (the
        patches), so a model dropped without ``restore()`` takes its routing with it."""
        self.live -= 1
        if self.live <= 0 and not self.restored:
            self.release_patches()

    def release_patches(self) -> None:
        """Give back the shared patches: the module globals and processor classes, the legacy attention classes."""
        if self.lease is not None:
            self.lease.release()
        if self.legacy is not None:
            self.legacy.restore()


class AppliedAttention:
    """An attention strategy applied to a diffusers target; :meth:`restore` undoes it (idempotent).

    ``modules``: a :class:`ModuleChange` per attention module, as applied; :meth:`states`: each module now.
    ``calls``: routed attention calls by path (``"processor"``, ``"sdpa"``, ``"dispatch"``, ``"scores"``,
    ``"legacy"``: legacy attention modules, which have no processor);
    ``calls_by_module``: by qualified module name; ``declined``: calls inside targeted modules left to diffusers, by
    reason. ``target``: the model or pipeline, or None once it was freed. Also a context manager that restores.
    """

    def __init__(self, target: Any) -> None:
        self._target = weak(target)
        self.modules: List[ModuleChange] = []
        self.routing = Routing()
        self.tally = self.routing.tally
        self.left_alone: List[str] = []
        self._modules: List[Tuple[str, "weakref.ref[nn.Module]"]] = []
        self._legacy: set = set()  # names of the legacy attention modules (no processor)
        self._undo_processors: List[ProcessorLayer] = []
        self._unwatch: List[Callable[[], None]] = []
        self._finalizers: List[weakref.finalize] = []
        #: a pipeline's transformers components, routed through transformers' AttentionInterface (restored with this)
        self.text: Any = None
        #: integrations that did not take effect because a library lacks a piece (:class:`npu_port.upstream.Decline`)
        self.declines: List[Any] = []

    @property
    def target(self) -> Any:
        """The model or pipeline this was applied to, or None once it was freed."""
        return self._target()

    # ---- recording (used while applying) ----------------------------------------------------------------------

    def _record(
        self,
        name: str,
        module: nn.Module,
        original: Any,
        action: str,
        installed: Any = None,
        label: Optional[str] = None,
        legacy: bool = False,
    ) -> None:
        """Note a module before changing it; ``installed``: the processor about to be set (None: unchanged);
        ``label``: what to call its processor (default: the class name of ``original``); ``legacy``: a legacy
        attention module, which has no processor (its class is routed)."""
        self.modules.append(ModuleChange(name, label or type(original).__name__, action))
        if legacy:
            self._legacy.add(name)
        self._modules.append((name, weakref.ref(module)))
        self.routing.live += 1
        self._finalizers.append(weakref.finalize(module, self.routing.module_freed))
        if installed is not None:
            layer = ProcessorLayer(name, module, original, installed)
            self._undo_processors.append(layer)
            _add_layer(layer, module)

    # ---- what happened ----------------------------------------------------------------------------------------

    @property
    def calls(self) -> Counter:
        return self.tally.calls

    @property
    def calls_by_module(self) -> Counter:
        return self.tally.by_module

    @property
    def declined(self) -> Counter:
        return self.tally.declined

    @property
    def total_calls(self) -> int:
        """Attention calls routed so far (all paths)."""
        return self.tally.total

    @property
    def restored(self) -> bool:
        return self.routing.restored

    def text_states(self) -> List[Any]:
        """The pipeline's transformers models as they are now (empty for a model)."""
        return self.text.states() if self.text is not None else []

    def upstream_declines(self) -> List[Any]:
        """What did not take effect because a library lacks a piece, text encoders included."""
        return list(self.declines) + (list(self.text.declines) if self.text is not None else [])

    def counts(self) -> Dict[str, int]:
        """Number of attention modules per action when applied (every action listed, zeros included)."""
        found = Counter(change.action for change in self.modules)
        return {action: found.get(action, 0) for action in ACTIONS}

    def states(self) -> List[ModuleState]:
        """Each attention module as it is now: its current processor and whether (and how) its attention is routed.

        A processor set since the strategy was applied is judged as it is; ``"freed"`` for a module that is gone.
        After ``restore()`` nothing is routed, so the states say what was applied (``modules``).
        """
        from .processor import RoutedAttnProcessor

        states: List[ModuleState] = []
        for (name, ref), change in zip(self._modules, self.modules):
            module = ref()
            if module is None:
                states.append(ModuleState(name, change.original, "freed", ACTION_MEANINGS["freed"]))
                continue
            processor = getattr(module, "processor", None)
            kind = type(processor)
            if name in self._legacy:
                states.append(ModuleState(name, change.original, *self._legacy_state(change.action)))
            elif change.action == "custom" or self.routing.restored:
                states.append(ModuleState(name, kind.__name__, change.action, ACTION_MEANINGS[change.action]))
            elif kind is RoutedAttnProcessor:
                stands = processor.stands_in_for.__name__  # type: ignore[union-attr]
                states.append(ModuleState(name, stands, "replaced", f"npu-port's processor, {stands}'s steps"))
            elif name not in self.routing.hooks:  # set by assignment (diffusers' PAG), not through set_processor
                detail = "set without set_processor (assigned to .processor), so npu-port did not see it: not routed"
                states.append(ModuleState(name, kind.__name__, "kept", detail))
            elif self.routing.lease is not None:
                state, detail = self.routing.lease.explain(kind)
                states.append(ModuleState(name, kind.__name__, state, detail))
            else:
                states.append(ModuleState(name, kind.__name__, "kept", "set after the strategy; not routed"))
        return states

    def _legacy_state(self, action: str) -> Tuple[str, str]:
        if action == "routed" and not self.routing.restored:
            return "routed", "legacy attention (no processor): its class's attention method routed inside this target"
        if action == "kept":
            return "kept", "legacy attention (no processor): a custom processor cannot be installed on it"
        return action, ACTION_MEANINGS[action]

    def describe(self) -> str:
        """A few lines for ``explain()``: what each module runs now, and how many calls went through."""
        target = self.target
        label = type(target).__name__ if target is not None else "(freed target)"
        state = "restored" if self.routing.restored else "active"
        legacy = f" and {len(self._legacy)} legacy" if self._legacy else ""
        diffusers = len(self.modules) - len(self._legacy)
        lines = [f"{label}: {diffusers} diffusers{legacy} attention modules ({state})"]
        states = self.states()
        for action in ACTIONS + ("freed",):
            chosen = [s for s in states if s.state == action]
            if not chosen:
                continue
            kinds = ", ".join(f"{n} x {name}" for name, n in sorted(Counter(s.processor for s in chosen).items()))
            lines.append(f"  {action}: {len(chosen)} ({kinds}): {ACTION_MEANINGS[action]}")
            if action in ("routed", "kept", "linear"):
                for detail, number in sorted(Counter((s.processor, s.detail) for s in chosen).items()):
                    lines.append(f"    {detail[0]}: {detail[1]}" + (f" ({number} modules)" if number > 1 else ""))
        if self.tally.calls:
            paths = ", ".join(f"{path} {n}" for path, n in sorted(self.tally.calls.items()))
            lines.append(f"  attention calls routed: {self.total_calls} ({paths})")
        for reason, number in sorted(self.tally.declined.items()):
            lines.append(f"  left to diffusers: {number} x {reason}")
        if self.text is not None:
            lines += [f"  {line}" for line in self.text.describe().splitlines()]
        lines += [f"  not routed: {decline}" for decline in self.declines]
        if self.left_alone:
            changed_count = len(self.left_alone)
            lines.append(
                f"  processor changed since, kept on restore: {changed_count} modules, e.g. {self.left_alone[0]}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts().items() if v)
        state = "restored" if self.routing.restored else "active"
        target = self.target
        label = type(target).__name__ if target is not None else "(freed target)"
        return f"<AppliedAttention on {label}: {counts}; {state}>"

    # ---- undo -------------------------------------------------------------------------------------------------

    def restore(self) -> None:
        """Stop watching, put back the original processor objects, remove the hooks, release the patches. Idempotent.

        A module whose processor is no longer the one installed here keeps its current one (see ``left_alone``),
        unless a newer application installed that one over ours: then that application restores our original.
        Modules that were freed meanwhile are passed over. Every step is attempted even if one fails; the first
        failure is raised at the end.
        """
        routing = self.routing
        if routing.restored:
            return
        routing.restored = True
        first_error: Optional[BaseException] = None
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()
        for unwatch in reversed(self._unwatch):  # first: putting processors back must not wake the watchers
            unwatch()
        self._unwatch.clear()
        for name in list(routing.hooks):
            routing.drop_hooks(name)
        for layer in reversed(self._undo_processors):
            if _take_layer(layer) is not None:  # a newer application sits on ours: it now restores our original
                continue
            module, original = layer.module, layer.original
            if module is None:
                continue
            current = getattr(module, "processor", None)
            if current is not layer.installed and current is not original:
                self.left_alone.append(layer.name)
                continue
            try:
                module.set_processor(original)
            except Exception as exc:  # an overridden set_processor that fails: set it directly
                try:
                    put_processor(module, original)
                except Exception:  # pragma: no cover - would need a module that refuses attribute assignment
                    first_error = first_error or exc
        self._undo_processors.clear()
        routing.release_patches()
        if self.text is not None:
            try:
                self.text.restore()
            except Exception as exc:  # pragma: no cover - restoring configs does not fail
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def __enter__(self) -> "AppliedAttention":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()
