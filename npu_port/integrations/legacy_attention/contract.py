"""The legacy attention contract, checked narrowly: which classes count as legacy attention, and where a target keeps
its instances.

Routing a method whose meaning we only guessed would change results silently, so the check is exact: parameter names,
the ``heads`` / ``scale`` attributes actually read. diffusers' current ``Attention`` has no ``_attention`` and never
matches.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Iterator, List, Optional, Set, Tuple

from torch import nn

from ...upstream.diffusers import attention as upstream
from ..attention_block import is_attention_block_class
from ..code_names import code_names

#: The legacy methods, with the parameters (after ``self``) each must have to be routed.
ATTENTION = ("_attention", ("query", "key", "value", "attention_mask"))
SLICED = ("_sliced_attention", ("query", "key", "value", "sequence_length", "dim", "attention_mask"))
SCORES = ("get_attention_scores", ("query", "key", "attention_mask"))
#: The per-module setter that old code calls to switch xformers on (and that raises without CUDA).
XFORMERS_SETTER = "set_use_memory_efficient_attention_xformers"
#: Where a setter is library code, not a repo-local copy (diffusers' own setters, told by the diffusers adapter, are
#: handled by the xformers hook).
LIBRARY_PREFIXES = ("torch", "npu_port")

ORIGINAL = "__npu_port_original__"  # set on every function npu-port installs: the function it stands in for


def original_function(value: Any) -> Any:
    """The user's function behind one npu-port installed (or ``value`` itself)."""
    return getattr(value, ORIGINAL, value)


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
            library = klass.__module__.split(".")[0] in LIBRARY_PREFIXES or upstream.is_diffusers_class(klass)
            return None if library else klass
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
