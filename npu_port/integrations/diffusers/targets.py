"""What a target is, and which attention modules it holds (with the names ``explain`` shows).

A target is a diffusers model, a pipeline (every ``torch.nn.Module`` component: unet, transformer, vae, controlnet,
text encoders — the last hold no diffusers attention: the applier routes them through transformers' attention
interface instead), or any ``torch.nn.Module`` that contains
diffusers attention modules. "Attention module" means what diffusers itself routes through a processor:
``diffusers.models.attention_processor.Attention`` and subclasses of the newer ``AttentionModuleMixin``
(``FluxAttention`` and friends) — and, beside them, the legacy attention a model may hold (a project's copy of
diffusers 0.11's ``CrossAttention``, diffusers' ``AttentionBlock``), which has no processor and is routed by the
legacy routes. Anything else is refused with an error that says what is accepted, because a silently ignored target
looks exactly like a working one.
"""

from __future__ import annotations

from typing import Any, List, Set, Tuple

from torch import nn

from ...upstream.diffusers import attention as upstream
from .classes import DiffusersClasses

ACCEPTED = (
    "a diffusers model (ModelMixin), a DiffusionPipeline, or a torch.nn.Module that contains diffusers "
    "Attention modules"
)
NO_ATTENTION = (
    "contains no attention module npu-port can route: no diffusers attention module (diffusers.models."
    "attention_processor.Attention or AttentionModuleMixin) and no legacy attention (a class with _attention(self, "
    "query, key, value, attention_mask=None) using self.heads and self.scale, or diffusers' AttentionBlock), so there "
    "is no attention to apply a strategy to"
)
#: Why the custom-processor strategy cannot take a target whose attention is all legacy.
LEGACY_ONLY = (
    "{name} has no diffusers attention module to install a custom processor on: its attention modules ({classes}) "
    "are legacy attention, which has no processor; apply a kernel strategy to it instead (they are routed)"
)


def no_attention_message(target: Any) -> str:
    """Why ``target`` has nothing to apply a strategy to."""
    return f"{type(target).__name__} {NO_ATTENTION}"


def describe_type(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def is_pipeline(target: Any, api: DiffusersClasses) -> bool:
    return api.DiffusionPipeline is not None and isinstance(target, api.DiffusionPipeline)


def unrecognised_pipeline(target: Any, api: DiffusersClasses) -> bool:
    """A diffusers pipeline that is not a ``DiffusionPipeline`` as found (the class could not be found: declined)."""
    return not is_pipeline(target, api) and not isinstance(target, nn.Module) and upstream.looks_like_pipeline(target)


def unrecognised_attention(target: Any, api: DiffusersClasses) -> List[str]:
    """Names of the modules in ``target`` that take diffusers processors but are none of the attention classes found
    (a class the adapter could not find: declined, left on diffusers' path)."""
    kinds = api.attention_module_classes
    return [
        ".".join(part for part in (prefix, name) if part)
        for prefix, component in components(target, api)
        for name, module in component.named_modules()
        if not (kinds and isinstance(module, kinds)) and upstream.looks_like_attention_module(module)
    ]


def components(target: Any, api: DiffusersClasses) -> List[Tuple[str, nn.Module]]:
    """``(prefix, module)`` pairs to search: the target itself, or a pipeline's module components by name."""
    if is_pipeline(target, api):
        return [(name, value) for name, value in target.components.items() if isinstance(value, nn.Module)]
    if isinstance(target, nn.Module):
        return [("", target)]
    raise TypeError(f"apply_to_target expects {ACCEPTED}; got {describe_type(target)}")


def attention_modules(target: Any, api: DiffusersClasses) -> List[Tuple[str, nn.Module]]:
    """Every diffusers attention module in ``target`` as ``(qualified name, module)``, each module once (none when
    diffusers is older than 0.12: it has no attention processors). Raises :class:`TypeError` for a target that is
    not a module or pipeline."""
    kinds = api.attention_module_classes
    found: List[Tuple[str, nn.Module]] = []
    seen: Set[int] = set()
    for prefix, component in components(target, api):
        if not kinds:
            continue
        for name, module in component.named_modules():
            if isinstance(module, kinds) and id(module) not in seen:
                seen.add(id(module))
                found.append((".".join(part for part in (prefix, name) if part), module))
    return found


def find_attention(
    target: Any, api: DiffusersClasses, others: bool = False, declined: bool = False
) -> Tuple[List[Tuple[str, nn.Module]], List[Tuple[str, nn.Module]]]:
    """``(diffusers attention modules, legacy attention modules)`` of ``target``, each as ``(qualified name,
    module)``; legacy ones are those :func:`npu_port.integrations.legacy_attention.find_legacy_attention` finds (a
    project's copy of diffusers 0.11's ``CrossAttention``, ControlVideo's ``FullyFrameAttention``, diffusers'
    ``AttentionBlock`` up to 0.16).

    Raises :class:`TypeError` for a target that is not a module or pipeline, and :class:`ValueError` when it holds
    neither kind, unless ``others`` (a pipeline whose text encoders have attention to route) or, when the attention
    classes ``declined`` (the adapter could not find one), it holds modules of a class it could not recognise
    (:func:`unrecognised_attention`: left on diffusers' path, and the decline says why).
    """
    from ..legacy_attention.contract import find_legacy_attention

    found = attention_modules(target, api)
    legacy = find_legacy_attention(target)
    unrecognised = declined and not found and not legacy and bool(unrecognised_attention(target, api))
    if not found and not legacy and not others and not unrecognised:
        raise ValueError(no_attention_message(target))
    return found, legacy
