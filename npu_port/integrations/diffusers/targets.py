"""What a target is, and which attention modules it holds (with the names ``explain`` shows).

A target is a diffusers model, a pipeline (every ``torch.nn.Module`` component: unet, transformer, vae, controlnet,
text encoders — the last hold no diffusers attention: the applier routes them through transformers' attention
interface instead), or any ``torch.nn.Module`` that contains
diffusers attention modules. "Attention module" means what diffusers itself routes through a processor:
``diffusers.models.attention_processor.Attention`` and subclasses of the newer ``AttentionModuleMixin``
(``FluxAttention`` and friends). Anything else is refused with an error that says what is accepted, because a
silently ignored target looks exactly like a working one.
"""

from __future__ import annotations

from typing import Any, List, Set, Tuple

from torch import nn

from .classes import DiffusersClasses

ACCEPTED = (
    "a diffusers model (ModelMixin), a DiffusionPipeline, or a torch.nn.Module that contains diffusers "
    "Attention modules"
)
NO_ATTENTION = (
    "contains no diffusers attention module (diffusers.models.attention_processor.Attention or "
    "AttentionModuleMixin), so there is no attention to apply a strategy to"
)
#: Where a strategy cannot be applied to modules but the legacy routing can route them (said with the version).
LEGACY_ROUTE = (
    "npu_port.patch_legacy_attention(model) routes them through the process-wide strategy instead (what "
    "enable_xformers_memory_efficient_attention() does under npu-port run)"
)


def no_attention_message(target: Any, api: DiffusersClasses) -> str:
    """Why ``target`` has nothing to apply a strategy to, with what npu-port does instead for an old diffusers."""
    name = type(target).__name__
    if not api.attention_module_classes:
        why = f"diffusers {api.version} has no attention processors (they came in 0.12)"
        return (
            f"{why}, so a strategy cannot be applied to {name}'s modules; its CrossAttention and AttentionBlock "
            f"modules are legacy attention: {LEGACY_ROUTE}"
        )
    blocks = api.AttentionBlock
    if blocks is not None and any(isinstance(m, blocks) for _, c in components(target, api) for m in c.modules()):
        return f"{name} {NO_ATTENTION}; its AttentionBlock modules (diffusers {api.version}) are legacy: {LEGACY_ROUTE}"
    return f"{name} {NO_ATTENTION}"


def describe_type(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def is_pipeline(target: Any, api: DiffusersClasses) -> bool:
    return api.DiffusionPipeline is not None and isinstance(target, api.DiffusionPipeline)


def components(target: Any, api: DiffusersClasses) -> List[Tuple[str, nn.Module]]:
    """``(prefix, module)`` pairs to search: the target itself, or a pipeline's module components by name."""
    if is_pipeline(target, api):
        return [(name, value) for name, value in target.components.items() if isinstance(value, nn.Module)]
    if isinstance(target, nn.Module):
        return [("", target)]
    raise TypeError(f"apply_to_target expects {ACCEPTED}; got {describe_type(target)}")


def attention_modules(target: Any, api: DiffusersClasses, allow_none: bool = False) -> List[Tuple[str, nn.Module]]:
    """Every diffusers attention module in ``target`` as ``(qualified name, module)``, each module once.

    Raises :class:`TypeError` for a target that is not a module or pipeline, and :class:`ValueError` when it holds
    no diffusers attention module (or diffusers is older than 0.12 and has none at all: the message says so), unless
    ``allow_none`` (a pipeline whose text encoders have attention to route).
    """
    kinds = api.attention_module_classes
    if not kinds and allow_none:
        components(target, api)
        return []
    if not kinds:
        components(target, api)  # a target of the wrong kind is a TypeError whatever the version
        raise ValueError(no_attention_message(target, api))
    found: List[Tuple[str, nn.Module]] = []
    seen: Set[int] = set()
    for prefix, component in components(target, api):
        for name, module in component.named_modules():
            if isinstance(module, kinds) and id(module) not in seen:
                seen.add(id(module))
                found.append((".".join(part for part in (prefix, name) if part), module))
    if not found and not allow_none:
        raise ValueError(no_attention_message(target, api))
    return found
