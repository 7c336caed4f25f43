"""The diffusers names the integration depends on, imported on first use and in one place — whatever the version.

diffusers is optional for npu-port, and importing it is not free (and on a machine with a broken torch_npu, importing
``diffusers.models.attention_processor`` itself fails on ``libhccl.so``). So nothing in this package imports
diffusers at module level: every diffusers class is looked up here, when a target is first applied to. Keeping the
list of names in one place also makes plain what the integration assumes about diffusers' internals.

Projects pin the diffusers of their time (Tune-A-Video and AnimateDiff pin 0.11.1), so :func:`load` describes what
the installed diffusers has instead of assuming the newest layout, and imports only modules that exist:

* ``attention_processor`` layout (0.15 onwards): ``Attention`` with processors in
  ``diffusers.models.attention_processor``;
* ``cross_attention`` layout (0.12–0.14): the same idea under older names — ``CrossAttention`` with
  ``CrossAttnProcessor``, ``XFormersCrossAttnProcessor`` and (0.13 onwards) ``AttnProcessor2_0`` in
  ``diffusers.models.cross_attention``;
* ``attention`` layout (0.11 and before): no processors; ``CrossAttention`` in ``diffusers.models.attention`` computes
  attention in ``_attention(query, key, value, attention_mask=None)`` — the legacy contract that
  :mod:`npu_port.integrations.legacy_attention` routes.

Up to 0.16 ``diffusers.models.attention.AttentionBlock`` (the VAE's and some UNet blocks' attention) computes its
attention inline in ``forward``; :mod:`npu_port.integrations.attention_block` routes it. A field is ``None`` where
the installed version lacks the class.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from ..._optional import extra_hint, installed_version

#: Where each processor layout keeps its attention class and processors, newest first.
PROCESSOR_MODULES = (
    ("attention_processor", "diffusers.models.attention_processor"),
    ("cross_attention", "diffusers.models.cross_attention"),
)
#: The layout of diffusers 0.11 and before: no processor module at all.
NO_PROCESSORS = "attention"
#: The module that holds ``AttentionBlock`` (<= 0.16) and, in <= 0.11, the legacy ``CrossAttention``.
ATTENTION_MODULE = "diffusers.models.attention"

#: Attribute names per layout: the attention class and the standard processors, as each layout spells them.
_NAMES = {
    "attention_processor": {
        "Attention": "Attention",
        "AttnProcessor": "AttnProcessor",
        "AttnProcessor2_0": "AttnProcessor2_0",
        "FusedAttnProcessor2_0": "FusedAttnProcessor2_0",
        "XFormersAttnProcessor": "XFormersAttnProcessor",
        "AttnProcessorNPU": "AttnProcessorNPU",
    },
    "cross_attention": {
        "Attention": "CrossAttention",
        "AttnProcessor": "CrossAttnProcessor",
        "AttnProcessor2_0": "AttnProcessor2_0",  # 0.13 and 0.14 only
        "XFormersAttnProcessor": "XFormersCrossAttnProcessor",
    },
}


@dataclass(frozen=True)
class DiffusersClasses:
    """The diffusers classes and functions the integration uses (``None`` where this diffusers version lacks one).

    ``layout``: ``"attention_processor"`` (0.15 onwards), ``"cross_attention"`` (0.12–0.14) or ``"attention"``
    (0.11 and before; see the module docstring). ``Attention`` and the processor fields are the processor-based
    classes under whatever name the layout gives them (``CrossAttention`` / ``CrossAttnProcessor`` /
    ``XFormersCrossAttnProcessor`` in 0.12–0.14); ``LegacyCrossAttention`` is 0.11's processor-less
    ``CrossAttention``; ``AttentionBlock`` the inline attention of diffusers up to 0.16.
    """

    version: str
    layout: str
    Attention: Optional[type]
    AttentionModuleMixin: Optional[type]
    DiffusionPipeline: Optional[type]
    AttnProcessor: Optional[type]
    AttnProcessor2_0: Optional[type]
    FusedAttnProcessor2_0: Optional[type]
    XFormersAttnProcessor: Optional[type]
    AttnProcessorNPU: Optional[type]
    attention_dispatch_module: Any
    dispatch_attention_fn: Optional[Callable[..., Any]]
    LegacyCrossAttention: Optional[type] = None
    AttentionBlock: Optional[type] = None

    @property
    def attention_module_classes(self) -> Tuple[type, ...]:
        """What counts as a diffusers attention module: ``Attention`` and the newer ``AttentionModuleMixin``
        (empty before processors existed, in 0.11 and earlier)."""
        found = (self.Attention, self.AttentionModuleMixin)
        return tuple(cls for cls in found if cls is not None)

    @property
    def default_processor(self) -> Optional[type]:
        """The standard processor npu-port's processor stands in for by default: ``AttnProcessor2_0`` where this
        version has it (0.13 onwards), else ``AttnProcessor`` (``CrossAttnProcessor`` in 0.12)."""
        return self.AttnProcessor2_0 or self.AttnProcessor

    def describe(self) -> str:
        """One phrase: the version and what npu-port does with its attention."""
        if self.layout == "attention_processor":
            how = "Attention modules with processors (diffusers.models.attention_processor)"
        elif self.layout == "cross_attention":
            how = "CrossAttention modules with processors (diffusers.models.cross_attention, 0.12-0.14 layout)"
        else:
            how = "no attention processors (before 0.12): CrossAttention's _attention is routed as legacy attention"
        block = "; AttentionBlock's inline attention routed" if self.AttentionBlock is not None else ""
        return f"diffusers {self.version}: {how}{block}"


_loaded: Optional[DiffusersClasses] = None


def _optional_attr(module_name: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return None


def _existing_module(name: str) -> Any:
    """The module ``name`` if this diffusers has it (imported), else None — never an import of what is not there."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None else importlib.import_module(name)


def import_error(exc: BaseException) -> ImportError:
    """The error for a diffusers that cannot be imported, saying what to do.

    Only a missing diffusers gets the install hint of npu-port's ``diffusers`` extra: an installed one (a project's
    pinned 0.11.1, say) would be upgraded by it, and the project's own imports broken. npu-port works with the
    version that is there, so the message says which it is and that its import is what needs fixing.
    """
    detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    version = installed_version("diffusers")
    if version is None:
        missing = f"npu-port's diffusers integration needs diffusers, which is not installed ({detail})"
        return ImportError(f"{missing}; {extra_hint('diffusers')}")
    hint = "fix that import (npu-port works with diffusers 0.11 onwards; upgrading diffusers is not needed)"
    if "huggingface_hub" in detail:
        hint += "; an old diffusers needs the huggingface_hub of its time, e.g. pip install 'huggingface_hub<0.26'"
    return ImportError(f"diffusers {version} is installed but cannot be imported ({detail}); {hint}")


def _detect() -> DiffusersClasses:
    import diffusers

    layout, processors = NO_PROCESSORS, None
    for name, module_name in PROCESSOR_MODULES:
        processors = _existing_module(module_name)
        if processors is not None:
            layout = name
            break
    attention = _existing_module(ATTENTION_MODULE)
    names = _NAMES.get(layout, {})

    def processor_attr(field: str) -> Optional[type]:
        return getattr(processors, names[field], None) if field in names else None

    dispatch_module = _existing_module("diffusers.models.attention_dispatch")  # 0.35 onwards
    pipeline = _optional_attr("diffusers.pipelines.pipeline_utils", "DiffusionPipeline") or _optional_attr(
        "diffusers.pipeline_utils",
        "DiffusionPipeline",  # where 0.11 and before keep it
    )
    return DiffusersClasses(
        version=getattr(diffusers, "__version__", None) or installed_version("diffusers") or "unknown",
        layout=layout,
        Attention=processor_attr("Attention"),
        AttentionModuleMixin=getattr(attention, "AttentionModuleMixin", None),
        DiffusionPipeline=pipeline,
        AttnProcessor=processor_attr("AttnProcessor"),
        AttnProcessor2_0=processor_attr("AttnProcessor2_0"),
        FusedAttnProcessor2_0=processor_attr("FusedAttnProcessor2_0"),
        XFormersAttnProcessor=processor_attr("XFormersAttnProcessor"),
        AttnProcessorNPU=processor_attr("AttnProcessorNPU"),
        attention_dispatch_module=dispatch_module,
        dispatch_attention_fn=getattr(dispatch_module, "dispatch_attention_fn", None),
        LegacyCrossAttention=getattr(attention, "CrossAttention", None) if layout == NO_PROCESSORS else None,
        AttentionBlock=getattr(attention, "AttentionBlock", None),
    )


def load() -> DiffusersClasses:
    """The diffusers classes of the installed version, importing diffusers on the first call.

    Raises :class:`ImportError` naming the cause when diffusers is missing or cannot be imported (see
    :func:`import_error`); an old diffusers is described, not refused.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        _loaded = _detect()
    except Exception as exc:  # a broken optional dependency of diffusers (torch_npu without CANN) lands here too
        raise import_error(exc) from exc
    return _loaded
