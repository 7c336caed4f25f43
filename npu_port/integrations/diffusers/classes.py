"""The diffusers names the integration depends on, imported on first use and in one place.

diffusers is optional for npu-port, and importing it is not free (and on a machine with a broken torch_npu, importing
``diffusers.models.attention_processor`` itself fails on ``libhccl.so``). So nothing in this package imports
diffusers at module level: every diffusers class is looked up here, when a target is first applied to, and a failure
to import becomes one :class:`ImportError` that says what to do. Keeping the list of names in one place also makes
plain what the integration assumes about diffusers' internals.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from ..._optional import extra_hint


@dataclass(frozen=True)
class DiffusersClasses:
    """The diffusers classes and functions the integration uses (``None`` where this diffusers version lacks one)."""

    version: str
    Attention: type
    AttentionModuleMixin: Optional[type]
    DiffusionPipeline: Optional[type]
    AttnProcessor: type
    AttnProcessor2_0: type
    FusedAttnProcessor2_0: Optional[type]
    XFormersAttnProcessor: Optional[type]
    AttnProcessorNPU: Optional[type]
    attention_dispatch_module: Any
    dispatch_attention_fn: Optional[Callable[..., Any]]

    @property
    def attention_module_classes(self) -> Tuple[type, ...]:
        """What counts as a diffusers attention module: ``Attention`` and the newer ``AttentionModuleMixin``."""
        found = (self.Attention, self.AttentionModuleMixin)
        return tuple(cls for cls in found if cls is not None)


_loaded: Optional[DiffusersClasses] = None


def _optional_attr(module_name: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return None


def load() -> DiffusersClasses:
    """The diffusers classes, importing diffusers on the first call.

    Raises :class:`ImportError` naming the cause when diffusers is missing or cannot be imported.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        import diffusers
        from diffusers.models import attention_processor as processors
    except Exception as exc:  # a broken optional dependency of diffusers (torch_npu without CANN) lands here too
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        hint = extra_hint("diffusers")
        raise ImportError(
            f"npu-port's diffusers integration needs diffusers, which cannot be imported ({detail}); {hint}"
        ) from exc
    try:
        dispatch_module = importlib.import_module("diffusers.models.attention_dispatch")
    except ImportError:  # diffusers before the attention dispatcher (< 0.35)
        dispatch_module = None
    _loaded = DiffusersClasses(
        version=getattr(diffusers, "__version__", "unknown"),
        Attention=processors.Attention,
        AttentionModuleMixin=_optional_attr("diffusers.models.attention", "AttentionModuleMixin"),
        DiffusionPipeline=_optional_attr("diffusers.pipelines.pipeline_utils", "DiffusionPipeline"),
        AttnProcessor=processors.AttnProcessor,
        AttnProcessor2_0=processors.AttnProcessor2_0,
        FusedAttnProcessor2_0=getattr(processors, "FusedAttnProcessor2_0", None),
        XFormersAttnProcessor=getattr(processors, "XFormersAttnProcessor", None),
        AttnProcessorNPU=getattr(processors, "AttnProcessorNPU", None),
        attention_dispatch_module=dispatch_module,
        dispatch_attention_fn=getattr(dispatch_module, "dispatch_attention_fn", None),
    )
    return _loaded
