"""Integrations with other libraries (diffusers today), kept at the edge of npu-port.

An integration imports the core (``npu_port.attn`` and friends) and the library it adapts; the core never imports
an integration. That keeps ``import npu_port`` free of optional packages and lets the attention kernels, the masks
and the device layer be tested without diffusers installed. Each integration imports its library lazily, inside
the functions that need it, so importing this package costs nothing either.

Each integration that can apply a strategy to a model registers a target applier here
(:mod:`npu_port.strategy.appliers`): that is how ``set_attention_strategy(target=model)`` reaches it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..strategy.appliers import register_target_applier


def _apply_to_diffusers_target(
    target: Any, attention_fn: Optional[Callable[..., Any]], *, processor_factory: Optional[Callable[[], Any]] = None
) -> Any:
    """The diffusers integration's target applier; the integration (and torch, diffusers) load on first use."""
    from .diffusers.apply import apply_to_target

    return apply_to_target(target, attention_fn, processor_factory=processor_factory)


#: ``set_attention_strategy(target=...)``'s applier for diffusers models and pipelines. It is the catch-all (no
#: ``accepts`` test): for a target that is neither, its errors say what a target may be. Registered on import, and
#: ``import npu_port`` imports this package, so a strategy can always be applied to a model.
DIFFUSERS_APPLIER = register_target_applier("diffusers", _apply_to_diffusers_target)


def is_transformers_model(target: Any) -> bool:
    """A transformers model (asking costs no import: :func:`npu_port.upstream.transformers.looks_like_model`)."""
    from ..upstream.transformers import looks_like_model

    return looks_like_model(target)


def _apply_to_transformers_target(
    target: Any, attention_fn: Optional[Callable[..., Any]], *, processor_factory: Optional[Callable[[], Any]] = None
) -> Any:
    """The transformers integration's target applier (a bare ``PreTrainedModel``; a pipeline's text encoders go
    through the diffusers applier, which calls the same function)."""
    from .transformers_attention import apply_to_transformers

    return apply_to_transformers(target, attention_fn, processor_factory=processor_factory)


#: ``set_attention_strategy(target=text_encoder)``: a transformers model routed through transformers' own attention
#: interface (:mod:`.transformers_attention`).
TRANSFORMERS_APPLIER = register_target_applier(
    "transformers", _apply_to_transformers_target, accepts=is_transformers_model
)
