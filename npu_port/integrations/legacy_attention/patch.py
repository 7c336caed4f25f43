"""Routing legacy attention classes, reversibly: :func:`patch_legacy_attention`, :func:`route_target_legacy` and
the :class:`LegacyPatch` that undoes either.

Methods are replaced on the *class* (the class of each module found, or the class given). Patches are shared and
counted: a class patched by two handles keeps its routed methods until both are restored, and a method goes back only
if it is still ours (if someone replaced it since, theirs stays). Per instance, ``_use_memory_efficient_attention_
xformers`` is cleared so ``forward`` takes the ``_attention`` path instead of importing xformers; restore sets back
the flags that were set.

Where a routed method sends the call is decided at each call (:mod:`npu_port.integrations.legacy_scope`):
:func:`patch_legacy_attention` routes its classes *process-wide* — every instance, those in the target and those
built later, goes through ``npu_port.attention`` — while :func:`route_target_legacy` (what ``set_attention_strategy(
target=model)`` uses) only makes the methods route where a targeted module's route is active: any other instance
computes what its own code computes.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import nn

from ... import _patching
from ..._patching import MISSING
from ...weak import weak
from ..attention_block import is_attention_block_class, routed_forward
from ..legacy_scope import hold_process_wide, release_process_wide
from .contract import (
    ATTENTION,
    SCORES,
    SLICED,
    XFORMERS_SETTER,
    find_legacy_attention,
    is_routable_class,
    legacy_method,
    original_function,
    repo_xformers_setter,
    target_modules,
)
from .routed import exact_attention_scores, ignored_xformers_setter, routed_attention, routed_sliced_attention

_FLAG = "_use_memory_efficient_attention_xformers"


#: The key of these patches in :mod:`npu_port._patching`.
KEY = "legacy_attention"


def active_patches() -> List[str]:
    """``Class.method`` for every method patched right now (for tests and ``explain``)."""
    return sorted({f"{p.owner.__qualname__}.{p.name}" for p in _patching.active(lambda key: key == KEY)})


def _replacements(cls: type) -> List[Tuple[str, Callable[..., Any]]]:
    """The routed methods for a legacy attention class: ``_attention`` always, its siblings when they are legacy;
    for diffusers' ``AttentionBlock``, ``forward``."""
    if is_attention_block_class(cls):
        return [("forward", routed_forward(original_function(inspect.getattr_static(cls, "forward")), cls))]
    builders = (
        (ATTENTION, routed_attention),
        (SLICED, routed_sliced_attention),
        (SCORES, exact_attention_scores),
    )
    found = []
    for method, build in builders:
        original = legacy_method(cls, method)
        if original is not None:
            found.append((method[0], build(original, cls)))
    return found


class LegacyPatch:
    """What one :func:`patch_legacy_attention` call did; :meth:`restore` undoes it (idempotent).

    ``classes``: names of the legacy attention classes routed; ``setters``: classes whose xformers setter was
    made a no-op; ``instances``: legacy attention modules found in the target; ``flags_cleared``: how many of them
    had xformers switched on. Also a context manager.
    """

    def __init__(self, target: Any, process_wide: bool = True) -> None:
        self._target = weak(target)  # never keeps the user's model alive (npu_port.weak)
        self.process_wide = process_wide
        self.classes: List[str] = []
        self.setters: List[str] = []
        self.instances = 0
        self._held: Dict[Tuple[type, str], _patching.Patch] = {}
        self._routed: List[type] = []  # the classes routed, each once
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
        with _patching.LOCK:
            if (cls, name) in self._held:
                return
            patch = _patching.find(cls, name, KEY)
            if patch is not None and patch.live:
                _patching.hold(patch)
            else:  # none yet, or someone replaced ours since: route on top of theirs
                patch = _patching.replace(cls, name, replacement, key=KEY)
            self._held[(cls, name)] = patch

    def _route_class(self, cls: type) -> None:
        if cls in self._routed:
            return
        for name, replacement in _replacements(cls):
            self._install(cls, name, replacement)
        self._routed.append(cls)
        if self.process_wide:
            hold_process_wide(cls)
        self.classes.append(cls.__qualname__)

    def _quiet_setter(self, cls: type) -> None:
        defining = repo_xformers_setter(cls)
        if defining is None or (cls, XFORMERS_SETTER) in self._held:
            return
        original = original_function(vars(defining)[XFORMERS_SETTER])
        self._install(cls, XFORMERS_SETTER, ignored_xformers_setter(cls, original))
        self.setters.append(cls.__qualname__)

    def _clear_flag(self, module: nn.Module) -> None:
        value = vars(module).get(_FLAG, MISSING)
        if value is not MISSING and value:
            self._flags.append((weak(module), value))
            setattr(module, _FLAG, False)

    def restore(self) -> None:
        """Put back the original functions (the very same objects) and the xformers flags. Idempotent."""
        if self.restored:
            return
        self.restored = True
        for module_ref, value in reversed(self._flags):
            module = module_ref()
            if module is not None and vars(module).get(_FLAG, MISSING) is False:
                setattr(module, _FLAG, value)
        self._flags.clear()
        with _patching.LOCK:
            if self.process_wide:
                for cls in self._routed:
                    release_process_wide(cls)
            self._routed.clear()
            for patch in reversed(list(self._held.values())):
                _patching.release(patch)
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


def route_target_legacy(target: Any, found: List[Tuple[str, nn.Module]]) -> LegacyPatch:
    """Route the legacy attention modules ``found`` in ``target`` (``find_legacy_attention(target)``) for a strategy
    applied to that target: their classes get the routed methods, which route only where a targeted module's route is
    active (the caller installs the modules' route hooks) and run the original code everywhere else; the modules'
    xformers flags are cleared. Repo-local xformers setters are left as they are: nothing outside the target changes.
    Undo with ``.restore()``."""
    patch = LegacyPatch(target, process_wide=False)
    try:
        for _, module in found:
            patch._route_class(type(module))
            patch._clear_flag(module)
        patch.instances = len(found)
    except BaseException:
        patch.restore()
        raise
    return patch
