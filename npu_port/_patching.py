"""The one way npu-port replaces an attribute of someone else's object and puts it back.

Every feature that patches — the CUDA redirect, diffusers' routed globals and processor classes, the ``set_processor``
watch, legacy attention classes, diffusers' xformers switches, safe math's ``autocast.__init__`` — goes through here,
so they all keep the same promises:

- **Exact restore.** The owner's own ``__dict__`` entry is remembered, not ``getattr``'s answer: an attribute that was
  inherited (``torch.Tensor.cuda`` lives on ``torch._C.TensorBase``) or absent is deleted again on restore, so lookups
  resolve exactly as before and the very same objects come back.
- **Shared and counted.** :func:`acquire` joins a live patch of the same attribute made for the same purpose (``key``)
  instead of stacking a second one; the attribute goes back when the last user :func:`release`\\ s it.
- **Only ours is undone.** On release, an attribute that someone replaced after us is left as it is — theirs stays,
  a :class:`PatchLeftInPlace` warning says so — while a later patch of *ours* on the same attribute is spliced
  (its original becomes ours), so our patches may be released in any order and still end exact. Until that later
  patch goes, it still calls the released replacement: a replacement that another of ours may wrap must pass
  through once released (safe math's and the CUDA redirect's ``autocast.__init__`` both do).
- **Nothing kept for nothing.** A released patch is forgotten: no originals are held once nothing is active.
- **One lock** (:data:`LOCK`, re-entrant) around every change; callers that must keep their own tables consistent with
  the patches take the same lock.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

#: The one lock of every patch npu-port makes (re-entrant: a mechanism may hold it while it patches).
LOCK = threading.RLock()

#: What :attr:`Patch.original` is when the owner's own ``__dict__`` had no such name (inherited or absent).
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()


class PatchLeftInPlace(RuntimeWarning):
    """A released patch was not undone because its attribute had been replaced by someone else since."""


def own_value(owner: Any, name: str) -> Any:
    """``owner``'s own entry for ``name`` (:data:`MISSING` when it has none: inherited, absent, or no ``__dict__``)."""
    try:
        return vars(owner).get(name, MISSING)
    except TypeError:  # an object without __dict__ (slots): what getattr sees is all there is
        return getattr(owner, name, MISSING)


def describe_owner(owner: Any) -> str:
    """A readable name for ``owner``: ``module.Class`` for a class, the module name for a module."""
    qualname = getattr(owner, "__qualname__", None)
    module = getattr(owner, "__module__", None)
    if isinstance(owner, type) and qualname:
        return f"{module}.{qualname}" if module else qualname
    return getattr(owner, "__name__", None) or type(owner).__name__


class Patch:
    """One live replacement of ``owner.name``: what was there (``original``, :data:`MISSING` for nothing of the
    owner's own), what we put (``replacement``), what it is for (``key``), how many users hold it, and a ``note`` its
    mechanism may keep with it (how a processor class is routed, say)."""

    __slots__ = ("owner", "name", "original", "replacement", "key", "users", "note", "__weakref__")

    def __init__(self, owner: Any, name: str, original: Any, replacement: Any, key: Hashable) -> None:
        self.owner, self.name, self.original, self.replacement, self.key = owner, name, original, replacement, key
        self.users = 0
        self.note: Any = None

    @property
    def live(self) -> bool:
        """Whether the attribute is still our replacement."""
        return own_value(self.owner, self.name) is self.replacement

    @property
    def where(self) -> str:
        return f"{describe_owner(self.owner)}.{self.name}"

    def __repr__(self) -> str:
        return f"<Patch {self.where} ({self.key!r}); {self.users} users>"


#: (id(owner), name) -> our live patches of that attribute, oldest first (each one's original is usually the
#: replacement of the one before; a foreign patch may sit between them).
_LIVE: Dict[Tuple[int, str], List[Patch]] = {}


def _set(owner: Any, name: str, value: Any) -> None:
    if value is MISSING:
        if own_value(owner, name) is not MISSING:
            delattr(owner, name)
    else:
        setattr(owner, name, value)


def replace(owner: Any, name: str, replacement: Any, *, key: Hashable = None) -> Patch:
    """Put ``replacement`` at ``owner.name`` now (on top of whatever is there, ours included); one user holds it."""
    with LOCK:
        patch = Patch(owner, name, own_value(owner, name), replacement, key)
        setattr(owner, name, replacement)
        patch.users = 1
        _LIVE.setdefault((id(owner), name), []).append(patch)
        return patch


def find(owner: Any, name: str, key: Hashable) -> Optional[Patch]:
    """Our live patch of ``owner.name`` made for ``key`` (the newest), or None."""
    with LOCK:
        for patch in reversed(tuple(_LIVE.get((id(owner), name), ()))):
            if patch.owner is owner and patch.key == key:
                return patch
        return None


def acquire(owner: Any, name: str, make: Callable[[Any], Optional[Any]], *, key: Hashable = None) -> Optional[Patch]:
    """Hold the patch of ``owner.name`` made for ``key``: join the live one, or make one.

    ``make(current)`` builds the replacement from what the attribute resolves to now (``getattr``, inherited values
    included); returning None means "nothing to patch". Returns None, changing nothing, also when our patch for
    ``key`` exists but someone replaced it since (theirs stays, and is not wrapped a second time).
    """
    with LOCK:
        patch = find(owner, name, key)
        if patch is not None:
            if not patch.live:
                return None
            patch.users += 1
            return patch
        replacement = make(getattr(owner, name, MISSING))
        if replacement is None:
            return None
        return replace(owner, name, replacement, key=key)


def hold(patch: Patch) -> Patch:
    """One more user of a live patch (found with :func:`find`), whether or not someone wrapped it since."""
    with LOCK:
        patch.users += 1
        return patch


def release(patch: Patch) -> bool:
    """One user fewer; the last one undoes the patch. Returns False when it was left in place (someone else's patch
    now sits on the attribute; a :class:`PatchLeftInPlace` warning names it) and True otherwise."""
    with LOCK:
        if patch.users <= 0:
            return True
        patch.users -= 1
        if patch.users > 0:
            return True
        slot = (id(patch.owner), patch.name)
        stack = _LIVE.get(slot, [])
        if patch in stack:
            stack.remove(patch)
        if not stack:
            _LIVE.pop(slot, None)
        if patch.live:
            _set(patch.owner, patch.name, patch.original)
            return True
        for later in stack:  # a later patch of ours wraps this one: it now wraps what this one wrapped
            if later.original is patch.replacement:
                later.original = patch.original
                return True
        warnings.warn(
            f"npu-port: {patch.where} was replaced by someone else after npu-port patched it; "
            "leaving the newer one in place",
            PatchLeftInPlace,
            stacklevel=3,
        )
        return False


def active(key_filter: Optional[Callable[[Hashable], bool]] = None) -> List[Patch]:
    """Every live patch (oldest first per attribute), optionally only those whose ``key`` passes ``key_filter``."""
    with LOCK:  # snapshots first: a weakref callback (a freed watched module) may release a patch meanwhile
        found = [patch for stack in tuple(_LIVE.values()) for patch in tuple(stack)]
    return [p for p in found if key_filter is None or key_filter(p.key)]
