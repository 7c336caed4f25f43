"""diffusers pieces: attention — the attention modules and processors of each of diffusers' layouts, the dispatcher
function kept processors call, ``AttentionBlock`` and 0.11's ``CrossAttention``, and the pipeline and model classes
the integration recognises and hooks.

diffusers has kept its attention in three layouts, and npu-port supports all of them:

* ``attention_processor`` (0.15 onwards): ``Attention`` with processors in ``diffusers.models.attention_processor``
  (and, from 0.35, ``AttentionModuleMixin`` for the newer attention classes and ``dispatch_attention_fn``);
* ``cross_attention`` (0.12-0.14): the same idea under older names — ``CrossAttention`` with ``CrossAttnProcessor``,
  ``XFormersCrossAttnProcessor`` and (0.13 onwards) ``AttnProcessor2_0`` in ``diffusers.models.cross_attention``;
* ``attention`` (0.11 and before): no processors; ``CrossAttention`` in ``diffusers.models.attention`` computes
  attention in ``_attention(query, key, value, attention_mask=None)`` (the legacy contract).

Up to 0.16 ``AttentionBlock`` (the VAE's attention) computes its attention inline in ``forward``.

Each piece is looked for in every layout's place, newest first. Some pieces belong to an era: a release that had not
introduced a piece yet (``AttnProcessorNPU`` before 0.28), or had removed it already (``AttentionBlock`` after 0.16),
lacks it by design, and that is no decline — the integration simply has nothing of that kind to handle. So each
piece carries its era (:data:`ERAS`): feature detection finds the value; the installed version only tells "not yet /
no longer" from "moved". A piece missing inside its era declines (:func:`decline`): what needs it stays on
diffusers' own path, with one warning, and ``explain()`` says so.

The features, each named for what stays on diffusers' path when it declines:

* :data:`MODULES` — attention modules recognised (``Attention``, ``AttentionModuleMixin``): the modules of a class
  that cannot be recognised are not routed at all;
* :data:`STANDARD` — the standard processors npu-port's processor stands in for: a processor of a kind that cannot be
  recognised keeps running (routed only where its own code calls SDPA);
* :data:`DISPATCH` — ``dispatch_attention_fn``: processors that call it run diffusers' dispatcher, unrouted;
* :data:`SCALE` — diffusers' ``deprecate`` for the deprecated ``scale`` argument: such a call runs diffusers' own
  processor;
* :data:`PIPELINES` — ``DiffusionPipeline``: a pipeline that cannot be recognised is left as it is;
* :data:`XFORMERS` — ``ModelMixin`` (and ``DiffusionPipeline``): the xformers switches of a class not found stay
  diffusers' own;
* :data:`LEGACY` — ``AttentionBlock`` (0.11-0.16) and 0.11's ``CrossAttention``: not routed.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..adapter import Decline, Piece

LIBRARY = "diffusers"

#: Attention modules of a processor layout recognised (and routed).
MODULES = "diffusers attention modules"
#: Standard processors replaced by npu-port's (a kind not recognised keeps its processor).
STANDARD = "diffusers standard processors stood in for"
#: Processors that call diffusers' attention dispatcher routed.
DISPATCH = "diffusers dispatcher calls"
#: npu-port's processor taking the deprecated ``scale`` argument as diffusers' does.
SCALE = "the deprecated scale argument of npu-port's processor"
#: Pipelines recognised (their components routed).
PIPELINES = "diffusers pipelines"
#: diffusers' xformers switches hooked (``npu-port run``, ``hook_enable_xformers``).
XFORMERS = "diffusers xformers switches"
#: diffusers' own legacy attention routed: ``AttentionBlock`` (0.11-0.16) and 0.11's ``CrossAttention``.
LEGACY = "diffusers legacy attention"

#: The layouts (see the module docstring).
ATTENTION_PROCESSOR = "attention_processor"
CROSS_ATTENTION = "cross_attention"
NO_PROCESSORS = "attention"

#: The method every processor-based attention module has, through which a processor is set (documented).
SET_PROCESSOR = "set_processor"
#: The name kept processors call the dispatcher by (how a processor that calls it is told, when it cannot be found).
DISPATCH_NAME = "dispatch_attention_fn"
#: ``dispatch_attention_fn``'s leading parameters, in order, as npu-port's stand-in reads a call
#: (:mod:`npu_port.integrations.diffusers.stand_ins`); ``backend`` and ``parallel_config`` are keyword-only.
DISPATCH_PARAMETERS = (
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
    "attention_kwargs",
)
#: The xformers switches of ``ModelMixin`` and ``DiffusionPipeline`` that npu-port's hook replaces.
XFORMERS_SWITCHES = (
    "enable_xformers_memory_efficient_attention",
    "disable_xformers_memory_efficient_attention",
    "set_use_memory_efficient_attention_xformers",
)

_PROCESSORS = "diffusers.models.attention_processor"
_CROSS = "diffusers.models.cross_attention"
_ATTENTION = "diffusers.models.attention"


def _processor_api(cls: Any) -> Optional[str]:
    if not isinstance(cls, type):
        return f"is not a class ({type(cls).__name__})"
    return None if callable(getattr(cls, SET_PROCESSOR, None)) else f"{cls.__name__} has no {SET_PROCESSOR}()"


def _is_class(value: Any) -> Optional[str]:
    return None if isinstance(value, type) else f"is not a class ({type(value).__name__})"


def _legacy_cross_attention(cls: Any) -> Optional[str]:
    """0.11's ``CrossAttention``: ``_attention`` and no processor (0.12-0.14 re-export their processor-based one)."""
    if not isinstance(cls, type):
        return f"is not a class ({type(cls).__name__})"
    if callable(getattr(cls, SET_PROCESSOR, None)):
        return "diffusers.models.attention.CrossAttention is processor-based here (no legacy _attention)"
    return None if callable(getattr(cls, "_attention", None)) else "CrossAttention has no _attention()"


def _has_switches(cls: Any) -> Optional[str]:
    if not isinstance(cls, type):
        return f"is not a class ({type(cls).__name__})"
    missing = [name for name in XFORMERS_SWITCHES if not callable(getattr(cls, name, None))]
    return f"{cls.__name__} has no {', '.join(missing)}" if missing else None


def _dispatch_signature(function: Any) -> Optional[str]:
    """The dispatcher takes its arguments as npu-port's stand-in reads them (:data:`DISPATCH_PARAMETERS` first)."""
    if not callable(function):
        return "dispatch_attention_fn is not callable"
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return "dispatch_attention_fn's signature cannot be read"
    positional = tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))[
        : len(DISPATCH_PARAMETERS)
    ]
    if positional != DISPATCH_PARAMETERS:
        return f"dispatch_attention_fn takes ({', '.join(positional)}), not ({', '.join(DISPATCH_PARAMETERS)})"
    return None


#: Per layout: what npu-port's processor reads of an attention module — it repeats the standard processors' steps
#: (:mod:`npu_port.integrations.diffusers.processor`), so a module must have all of these to be stood in on. The
#: methods are checked on the attention class (the piece ``processor steps``), all of them on each module.
STEPS = "processor steps"
STEP_METHODS = {
    ATTENTION_PROCESSOR: ("prepare_attention_mask", "norm_encoder_hidden_states"),
    CROSS_ATTENTION: ("prepare_attention_mask", "get_attention_scores"),
}
STEP_ATTRIBUTES = {
    ATTENTION_PROCESSOR: ("heads", "scale", "to_q", "to_k", "to_v", "to_out", "norm_cross", "group_norm"),
    CROSS_ATTENTION: ("heads", "scale", "to_q", "to_k", "to_v", "to_out"),
}


def _processor_steps(adapter: Any) -> Tuple[str, ...]:
    """The attention class's methods that npu-port's processor calls, found on it (none to check without the class:
    then nothing is stood in for anyway)."""
    attention = adapter.get("Attention")
    if attention is None:
        return ()
    names = STEP_METHODS[layout()]
    missing = [name for name in names if not callable(getattr(attention, name, None))]
    if missing:
        raise LookupError(f"{attention.__name__} has no {', '.join(missing)} (npu-port's processor calls it)")
    return names


#: name -> (the first release with it, the first release without it): outside that range its absence is by design
#: (see the module docstring). Read from diffusers' sources of each release.
ERAS: Dict[str, Tuple[str, Optional[str]]] = {
    "Attention": ("0.12", None),
    "AttentionModuleMixin": ("0.35", None),
    "AttnProcessor": ("0.12", None),
    "AttnProcessor2_0": ("0.13", None),
    "FusedAttnProcessor2_0": ("0.25", None),
    "XFormersAttnProcessor": ("0.12", None),
    STEPS: ("0.12", None),
    "AttnProcessorNPU": ("0.28", None),
    "dispatch_attention_fn": ("0.35", None),
    "deprecate": ("0.3", None),
    "DiffusionPipeline": ("0.1", None),
    "ModelMixin": ("0.1", None),
    "AttentionBlock": ("0.1", "0.17"),
    "CrossAttention": ("0.1", "0.12"),
}


def _piece(name: str, feature: str, *where: str, **options: Any) -> Piece:
    return Piece(name, feature, where=where, since=ERAS[name][0], **options)


PIECES = (
    _piece(
        "Attention",
        MODULES,
        f"{_PROCESSORS}:Attention",
        f"{_CROSS}:CrossAttention",
        check=_processor_api,
        public=True,
    ),
    _piece("AttentionModuleMixin", MODULES, f"{_ATTENTION}:AttentionModuleMixin", check=_processor_api),
    _piece(
        "AttnProcessor",
        STANDARD,
        f"{_PROCESSORS}:AttnProcessor",
        f"{_CROSS}:CrossAttnProcessor",
        check=_is_class,
        public=True,
    ),
    _piece(
        "AttnProcessor2_0",
        STANDARD,
        f"{_PROCESSORS}:AttnProcessor2_0",
        f"{_CROSS}:AttnProcessor2_0",
        check=_is_class,
        public=True,
    ),
    _piece("FusedAttnProcessor2_0", STANDARD, f"{_PROCESSORS}:FusedAttnProcessor2_0", check=_is_class, public=True),
    _piece(
        "XFormersAttnProcessor",
        STANDARD,
        f"{_PROCESSORS}:XFormersAttnProcessor",
        f"{_CROSS}:XFormersCrossAttnProcessor",
        check=_is_class,
        public=True,
    ),
    _piece("AttnProcessorNPU", STANDARD, f"{_PROCESSORS}:AttnProcessorNPU", check=_is_class, public=True),
    Piece(STEPS, STANDARD, derive=_processor_steps, since=ERAS[STEPS][0]),
    _piece(
        "dispatch_attention_fn",
        DISPATCH,
        "diffusers.models.attention_dispatch:dispatch_attention_fn",
        check=_dispatch_signature,
    ),
    _piece("deprecate", SCALE, "diffusers.utils:deprecate", "diffusers.utils.deprecation_utils:deprecate"),
    _piece(
        "DiffusionPipeline",
        PIPELINES,
        "diffusers:DiffusionPipeline",
        "diffusers.pipelines:DiffusionPipeline",
        "diffusers.pipelines.pipeline_utils:DiffusionPipeline",
        "diffusers.pipeline_utils:DiffusionPipeline",  # 0.11
        check=_is_class,
        public=True,
    ),
    _piece(
        "ModelMixin",
        XFORMERS,
        "diffusers:ModelMixin",
        "diffusers.models:ModelMixin",
        "diffusers.models.modeling_utils:ModelMixin",
        "diffusers.modeling_utils:ModelMixin",  # 0.11
        check=_has_switches,
        public=True,
    ),
    _piece("AttentionBlock", LEGACY, f"{_ATTENTION}:AttentionBlock", check=_is_class),
    _piece("CrossAttention", LEGACY, f"{_ATTENTION}:CrossAttention", check=_legacy_cross_attention),
)

#: The pieces of each feature that the routing of a target needs (0.11's ``CrossAttention`` is found in a target by
#: its contract, so only ``npu-port run``'s process-wide routing needs the class itself).
ROUTING = {
    MODULES: ("Attention", "AttentionModuleMixin"),
    STANDARD: (
        "AttnProcessor",
        "AttnProcessor2_0",
        "FusedAttnProcessor2_0",
        "XFormersAttnProcessor",
        "AttnProcessorNPU",
        STEPS,
    ),
    DISPATCH: ("dispatch_attention_fn",),
    SCALE: ("deprecate",),
    LEGACY: ("AttentionBlock",),
}


def _adapter() -> Any:
    from . import ADAPTER

    return ADAPTER


# ---- eras and declines -----------------------------------------------------------------------------------------------


def _release(version: Optional[str]) -> Tuple[int, ...]:
    """``"0.36.0.dev0"`` -> ``(0, 36, 0)``: the leading number of each dotted part (a local build counts as its
    release)."""
    numbers = []
    for part in str(version or "").split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


@functools.lru_cache(maxsize=None)
def _installed() -> Tuple[int, ...]:
    """The installed release, read once per process (reading package metadata takes milliseconds)."""
    return _release(_adapter().version())


def released_by(version: str) -> bool:
    """Whether the installed diffusers is release ``version`` or a later one; True when its version cannot be read
    (then every piece is expected)."""
    installed = _installed()
    return not installed or installed >= _release(version)


def expected(*names: str) -> List[str]:
    """The pieces among ``names`` that the installed diffusers should have (its release is within their era); all of
    them when the version cannot be read."""
    installed = _installed()
    if not installed:
        return list(names)
    found = []
    for name in names:
        since, until = ERAS.get(name, ("0", None))
        if installed >= _release(since) and (until is None or installed < _release(until)):
            found.append(name)
    return found


def decline(feature: str, *names: str) -> Optional[Decline]:
    """None when every piece of ``names`` this release should have is there; else the :class:`Decline` (kept, and
    warned about once per process). ``names`` default to the pieces the routing of a target needs for ``feature``."""
    return _adapter().decline(feature, *expected(*(names or ROUTING.get(feature, ()))))


def missing(feature: str, *names: str) -> List[str]:
    """The pieces of ``names`` (default: :data:`ROUTING`'s for ``feature``) this release should have and lacks,
    without declining."""
    return _adapter().missing(*expected(*(names or ROUTING.get(feature, ()))))


def routing_declines() -> List[Decline]:
    """The declines of applying a strategy to a target's diffusers attention (:data:`ROUTING`), each warned once."""
    found = [decline(feature) for feature in ROUTING]
    return [d for d in found if d is not None]


def require(feature: str, *names: str) -> None:
    """Raise :class:`~npu_port.upstream.UpstreamMissingError` when a piece this release should have is missing: for
    an explicit request that cannot be honoured without it (checked before any work)."""
    _adapter().require(feature, *expected(*(names or ROUTING.get(feature, ()))))


# ---- what the installed diffusers has ----------------------------------------------------------------------------


def can_stand_in() -> bool:
    """Whether npu-port's processor can stand in for the standard ones: the attention class has the methods its
    steps call (the piece :data:`STEPS`; declined as :data:`STANDARD` when not)."""
    return _adapter().has(STEPS)


def missing_steps(module: Any) -> List[str]:
    """What npu-port's processor reads that this attention module lacks (empty: it can be stood in on)."""
    names = STEP_ATTRIBUTES.get(layout(), ()) + STEP_METHODS.get(layout(), ())
    return [name for name in names if not hasattr(module, name)]


def get(name: str) -> Any:
    """The piece ``name``, or None (missing, or not of this release)."""
    return _adapter().get(name)


def attention_class() -> type:
    """diffusers' processor-based attention class (``Attention``; 0.12-0.14's ``CrossAttention``), for building a
    model with it: an explicit request, refused (:class:`~npu_port.upstream.UpstreamMissingError`) without it."""
    _adapter().require(MODULES, "Attention")
    return get("Attention")


def imported() -> bool:
    """Whether diffusers was imported already (asked without importing it)."""
    return LIBRARY in sys.modules


def layout() -> str:
    """:data:`ATTENTION_PROCESSOR`, :data:`CROSS_ATTENTION` or :data:`NO_PROCESSORS`: where the attention class found
    lives."""
    attention = get("Attention")
    if attention is None:
        return NO_PROCESSORS
    module = str(getattr(attention, "__module__", ""))
    return CROSS_ATTENTION if module.rpartition(".")[2] == CROSS_ATTENTION else ATTENTION_PROCESSOR


def attention_module_classes() -> Tuple[type, ...]:
    """What counts as a diffusers attention module: ``Attention`` and the newer ``AttentionModuleMixin`` (none before
    processors existed, in 0.11 and earlier)."""
    return tuple(cls for cls in (get("Attention"), get("AttentionModuleMixin")) if cls is not None)


def default_processor() -> Optional[type]:
    """The standard processor npu-port's processor stands in for by default: ``AttnProcessor2_0`` where this release
    has it (0.13 onwards), else ``AttnProcessor`` (``CrossAttnProcessor`` in 0.12)."""
    return get("AttnProcessor2_0") or get("AttnProcessor")


def deprecate_function() -> Optional[Callable[..., Any]]:
    """diffusers' ``deprecate`` (what its processors warn about the ``scale`` argument with), or None."""
    return get("deprecate")


def is_diffusers_class(cls: Any) -> bool:
    """Whether ``cls`` (a class or a function) is diffusers' own code, told from the module that defines it."""
    module = getattr(cls, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] == LIBRARY


def is_diffusers_function(function: Any) -> bool:
    """Whether ``function`` (or the function of a bound method) is defined in diffusers."""
    return is_diffusers_class(getattr(function, "__func__", function))


def looks_like_attention_module(module: Any) -> bool:
    """A module of a diffusers class that takes processors, recognised even when the attention classes could not be
    found (a release that moved them): such a module is declined with the reason, not mistaken for none."""
    return is_diffusers_class(type(module)) and callable(getattr(module, SET_PROCESSOR, None))


def is_pipeline(obj: Any) -> bool:
    """A ``DiffusionPipeline`` (False when the class cannot be found: see :func:`looks_like_pipeline`)."""
    cls = get("DiffusionPipeline")
    return cls is not None and isinstance(obj, cls)


def looks_like_pipeline(obj: Any) -> bool:
    """A diffusers pipeline, even when ``DiffusionPipeline`` cannot be found: an object of a diffusers class (or a
    subclass of one) with a ``components`` dict."""
    try:
        mro = type(obj).__mro__
    except AttributeError:  # pragma: no cover - every type has an MRO
        return False
    return any(is_diffusers_class(cls) for cls in mro) and isinstance(getattr(obj, "components", None), dict)


def is_dispatch_module(name: str) -> bool:
    """Whether ``name`` is the module that defines diffusers' dispatcher (its backends call the real SDPA: never
    patched)."""
    function = get(DISPATCH_NAME)
    return function is not None and name == getattr(function, "__module__", None)


def loaded_modules() -> List[types.ModuleType]:
    """Every diffusers module imported so far (none is imported here)."""
    prefix = f"{LIBRARY}."
    return [m for n, m in list(sys.modules.items()) if n.startswith(prefix) and isinstance(m, types.ModuleType)]


def attention_block_class() -> Optional[type]:
    """diffusers' ``AttentionBlock`` (up to 0.16) when diffusers was imported already (no instance can exist
    otherwise, and importing diffusers costs seconds), else None."""
    return get("AttentionBlock") if imported() else None


def legacy_classes() -> List[type]:
    """diffusers' own attention classes of the pre-processor era, routed process-wide like a project's (``npu-port
    run``): 0.11's ``CrossAttention`` and ``AttentionBlock`` (<= 0.16). None for a release outside their era (and
    nothing is imported for it); one that should have them and does not declines (:data:`LEGACY`)."""
    names = expected("CrossAttention", "AttentionBlock")
    if not names:
        return []
    decline(LEGACY, *names)
    return [cls for cls in (get(name) for name in names) if cls is not None]


def xformers_switch_classes() -> List[type]:
    """``ModelMixin`` and ``DiffusionPipeline``, whose xformers switches npu-port's hook replaces; a class that cannot
    be found declines (:data:`XFORMERS`) and keeps its switches. Empty when diffusers cannot be imported (nothing to
    hook: a project that uses it will say so itself)."""
    try:
        if _adapter().module() is None:
            return []
    except Exception:  # a broken optional dependency of diffusers (torch_npu without CANN)
        return []
    decline(XFORMERS, "ModelMixin", "DiffusionPipeline")
    found = [get("ModelMixin"), get("DiffusionPipeline")]
    return [cls for cls in found if cls is not None and not _has_switches(cls)]


@dataclass(frozen=True)
class DiffusersClasses:
    """The diffusers classes and functions the integration uses, as found now (``None`` where this diffusers version
    lacks one).

    ``layout``: :data:`ATTENTION_PROCESSOR` (0.15 onwards), :data:`CROSS_ATTENTION` (0.12–0.14) or
    :data:`NO_PROCESSORS` (0.11 and before). ``Attention`` and the processor fields are the processor-based classes
    under whatever name the layout gives them (``CrossAttention`` / ``CrossAttnProcessor`` /
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
    dispatch_attention_fn: Optional[Callable[..., Any]]
    LegacyCrossAttention: Optional[type] = None
    AttentionBlock: Optional[type] = None

    @property
    def attention_module_classes(self) -> Tuple[type, ...]:
        """What counts as a diffusers attention module (see :func:`attention_module_classes`)."""
        found = (self.Attention, self.AttentionModuleMixin)
        return tuple(cls for cls in found if cls is not None)

    @property
    def default_processor(self) -> Optional[type]:
        """See :func:`default_processor`."""
        return self.AttnProcessor2_0 or self.AttnProcessor

    def describe(self) -> str:
        """One phrase: the version and what npu-port does with its attention."""
        if self.layout == ATTENTION_PROCESSOR:
            how = f"Attention modules with processors ({_PROCESSORS})"
        elif self.layout == CROSS_ATTENTION:
            how = f"CrossAttention modules with processors ({_CROSS}, 0.12-0.14 layout)"
        elif self.LegacyCrossAttention is not None:
            how = "no attention processors (before 0.12): CrossAttention's _attention is routed as legacy attention"
        else:
            how = "no attention processors found"
        block = "; AttentionBlock's inline attention routed" if self.AttentionBlock is not None else ""
        return f"diffusers {self.version}: {how}{block}"


def classes() -> DiffusersClasses:
    """What the installed diffusers has, as found now (each piece is resolved once; this only reads them)."""
    adapter = _adapter()
    module = adapter.module()
    version = getattr(module, "__version__", None) or adapter.version() or "unknown"
    found = {name: get(name) for name in ERAS}
    return DiffusersClasses(
        version=version,
        layout=layout(),
        Attention=found["Attention"],
        AttentionModuleMixin=found["AttentionModuleMixin"],
        DiffusionPipeline=found["DiffusionPipeline"],
        AttnProcessor=found["AttnProcessor"],
        AttnProcessor2_0=found["AttnProcessor2_0"],
        FusedAttnProcessor2_0=found["FusedAttnProcessor2_0"],
        XFormersAttnProcessor=found["XFormersAttnProcessor"],
        AttnProcessorNPU=found["AttnProcessorNPU"],
        dispatch_attention_fn=found["dispatch_attention_fn"],
        LegacyCrossAttention=found["CrossAttention"],
        AttentionBlock=found["AttentionBlock"],
    )
