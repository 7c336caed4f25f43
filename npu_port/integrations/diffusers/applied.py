"""The record of one application: what changed where, how many calls went through, and how to undo it all.

Restoring must give back the very processor objects that were there (processors can carry trained weights and
user state), remove every hook, and release the shared patches, so the model computes bit-for-bit what it did
before. Undo steps are recorded *before* each change is made, which is what lets a failure half-way through
``apply_to_target`` be undone with the same :meth:`AppliedAttention.restore`.

Restore undoes what the application did and nothing else: a module whose processor was changed by someone else
since (IP-Adapter loading, ``set_attention_slice``, ``set_default_attn_processor``) keeps that newer processor —
putting the old one back would, for instance, leave an IP-Adapter's image projection feeding tuples to a processor
that cannot read them. Such modules are listed in ``AppliedAttention.left_alone``.

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
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from torch import nn
from torch.utils.hooks import RemovableHandle

from .patches import PatchLease
from .routing import Tally

#: What happened to each attention module, in the order ``counts()`` reports them.
ACTIONS = ("replaced", "routed", "kept", "custom")

ACTION_MEANINGS = {
    "replaced": "standard processor replaced by npu-port's (attention core routed)",
    "routed": "specialised processor kept; its SDPA / dispatch_attention_fn call is routed",
    "kept": "processor kept; it computes attention itself (no SDPA or dispatcher call to route)",
    "custom": "custom processor installed",
}


class ModuleChange(NamedTuple):
    """One attention module: qualified name, class name of the processor it had, and the action taken."""

    name: str
    original: str
    action: str


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
    when an older application under this one is restored first)."""

    __slots__ = ("name", "module", "original", "installed")

    def __init__(self, name: str, module: nn.Module, original: Any, installed: Any) -> None:
        self.name = name
        self.module = module
        self.original = original
        self.installed = installed


_layers_lock = threading.RLock()
#: module -> the layers of every active application on it, oldest first (weak: a dropped model takes its entry).
_LAYERS: "weakref.WeakKeyDictionary[nn.Module, List[ProcessorLayer]]" = weakref.WeakKeyDictionary()


def _add_layer(layer: ProcessorLayer) -> None:
    with _layers_lock:
        _LAYERS.setdefault(layer.module, []).append(layer)


def _take_layer(layer: ProcessorLayer) -> Optional[ProcessorLayer]:
    """Remove ``layer`` from its module's table; the newer layer stacked on it (installed over its processor), to
    which its original is handed down, or None when it is the top one."""
    with _layers_lock:
        stack = _LAYERS.get(layer.module, [])
        if layer in stack:
            stack.remove(layer)
            if not stack:
                del _LAYERS[layer.module]
        above = next((other for other in stack if other.original is layer.installed), None)
        if above is not None:
            above.original = layer.original
        return above


class AppliedAttention:
    """An attention strategy applied to a diffusers target; :meth:`restore` undoes it (idempotent).

    ``modules``: a :class:`ModuleChange` per attention module. ``calls``: routed attention calls by path
    (``"processor"``, ``"sdpa"``, ``"dispatch"``); ``calls_by_module``: by qualified module name; ``declined``:
    calls inside targeted modules left to diffusers, by reason. Also a context manager that restores on exit.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.modules: List[ModuleChange] = []
        self.tally = Tally()
        self.left_alone: List[str] = []
        self._undo_processors: List[ProcessorLayer] = []
        self._handles: List[RemovableHandle] = []
        self._unwatch: List[Callable[[], None]] = []
        self._lease: Optional[PatchLease] = None
        self._restored = False

    # ---- recording (used while applying) ----------------------------------------------------------------------

    def _record(self, name: str, module: nn.Module, original: Any, action: str, installed: Any = None) -> None:
        """Note a module before changing it; ``installed``: the processor about to be set (None: unchanged)."""
        self.modules.append(ModuleChange(name, type(original).__name__, action))
        if installed is not None:
            layer = ProcessorLayer(name, module, original, installed)
            self._undo_processors.append(layer)
            _add_layer(layer)

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
        return self._restored

    def counts(self) -> Dict[str, int]:
        """Number of attention modules per action (every action listed, zeros included)."""
        found = Counter(change.action for change in self.modules)
        return {action: found.get(action, 0) for action in ACTIONS}

    def describe(self) -> str:
        """A few lines for ``explain()``: what was done to which modules and how many calls went through."""
        target = type(self.target).__name__
        state = "restored" if self._restored else "active"
        lines = [f"{target}: {len(self.modules)} diffusers attention modules ({state})"]
        for action, number in self.counts().items():
            if number:
                originals = Counter(c.original for c in self.modules if c.action == action)
                kinds = ", ".join(f"{n} x {name}" for name, n in sorted(originals.items()))
                lines.append(f"  {action}: {number} ({kinds}): {ACTION_MEANINGS[action]}")
        if self.tally.calls:
            paths = ", ".join(f"{path} {n}" for path, n in sorted(self.tally.calls.items()))
            lines.append(f"  attention calls routed: {self.total_calls} ({paths})")
        for reason, number in sorted(self.tally.declined.items()):
            lines.append(f"  left to diffusers: {number} x {reason}")
        if self.left_alone:
            changed = len(self.left_alone)
            lines.append(f"  processor changed since, kept on restore: {changed} modules, e.g. {self.left_alone[0]}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts().items() if v)
        state = "restored" if self._restored else "active"
        return f"<AppliedAttention on {type(self.target).__name__}: {counts}; {state}>"

    # ---- undo -------------------------------------------------------------------------------------------------

    def restore(self) -> None:
        """Stop watching, put back the original processor objects, remove the hooks, release the patches. Idempotent.

        A module whose processor is no longer the one installed here keeps its current one (see ``left_alone``),
        unless a newer application installed that one over ours: then that application restores our original.
        Every step is attempted even if one fails; the first failure is raised at the end.
        """
        if self._restored:
            return
        self._restored = True
        first_error: Optional[BaseException] = None
        for unwatch in reversed(self._unwatch):  # first: putting processors back must not wake the watchers
            unwatch()
        self._unwatch.clear()
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()
        for layer in reversed(self._undo_processors):
            if _take_layer(layer) is not None:  # a newer application sits on ours: it now restores our original
                continue
            module, original = layer.module, layer.original
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
        if self._lease is not None:
            self._lease.release()
        if first_error is not None:
            raise first_error

    def __enter__(self) -> "AppliedAttention":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()
