"""``apply_to_target``: point every attention module of a diffusers model or pipeline at one attention function.

Two mechanisms, chosen per module by the processor it has:

* a *standard* processor (``AttnProcessor2_0``, ``AttnProcessor``, ``FusedAttnProcessor2_0``,
  ``XFormersAttnProcessor``, ``AttnProcessorNPU``) is replaced by :class:`~.processor.RoutedAttnProcessor`, which
  repeats its steps and routes the core — the processors that break off-device are exactly these;
* any other processor (SD3's joint attention, Flux's dispatcher, added-KV, sliced, IP-Adapter and custom-diffusion
  processors, user processors) is kept, and what computes its attention is routed while the module runs
  (:mod:`.routing`): its call to SDPA or ``dispatch_attention_fn`` (:mod:`.patches`), or its ``__call__`` in place
  when it goes through ``get_attention_scores`` (:mod:`.scores`). One that can be routed by neither is reported as
  not routed, with the reason; linear attention (Sana) as linear.

Legacy attention in the target (a project's copy of diffusers 0.11's ``CrossAttention``, ControlVideo's
``FullyFrameAttention``, diffusers' ``AttentionBlock`` up to 0.16) has no processor: its class gets the legacy routed
methods, which route through the target's attention function while the module runs and run the original code
anywhere else (:mod:`npu_port.integrations.legacy_scope`), so a mixed model has every attention call routed.

A module with a kept processor gets routing hooks; a replaced one gets none (our processor routes its own core).
Every module is watched, so a processor set on it later (``set_default_attn_processor``, attention slicing,
``fuse_qkv_projections``, IP-Adapter loading, ``set_attn_processor``) is routed the moment it is set, by the same
rules (:mod:`.watch`). The shared patches are taken only when some processor needs them: a model whose processors are
all replaced runs with no hook and no patch. With a ``processor_factory`` (the ``custom-processor`` strategy) every
module gets a fresh processor from it instead and nothing is routed.

All or nothing: if anything fails half-way, everything done so far is undone before the error propagates.

What diffusers' adapter cannot find declines (:mod:`npu_port.upstream.diffusers.attention`): a pipeline whose class
it cannot find is left as it is; attention modules of a class it cannot find, processors of a standard kind it cannot
find, processors that call a dispatcher it cannot find stay on diffusers' path. Each is warned about once and listed
in ``explain()`` / ``report()["declines"]``; nothing raises for it — except an explicit ``custom-processor`` request
that finds no module to install on because of it, which is refused before any change.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import nn

from ...upstream.diffusers import attention as upstream
from . import classes
from .applied import AppliedAttention, Routing
from .patches import PatchLease
from .processor import RoutedAttnProcessor
from .routing import AttentionFn, Route, install_route_hooks
from .scores import diffusers_scores
from .targets import LEGACY_ONLY, components, describe_type, find_attention, is_pipeline, unrecognised_pipeline
from .watch import watch

ATTENTION_FN_SIGNATURE = (
    "(query, key, value, attn_mask=None, *, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> Tensor"
)


def _standard_processors(api: classes.DiffusersClasses) -> Dict[type, Tuple[type, bool]]:
    """Standard processor class -> (the class our processor stands in for, whether it uses fused projections); empty
    when our processor's steps cannot run on this diffusers' attention class (declined: :data:`upstream.STANDARD`)."""
    if not upstream.can_stand_in():
        return {}
    table: Dict[type, Tuple[type, bool]] = {
        standard: (standard, False) for standard in (api.AttnProcessor2_0, api.AttnProcessor) if standard is not None
    }
    if api.FusedAttnProcessor2_0 is not None:
        table[api.FusedAttnProcessor2_0] = (api.FusedAttnProcessor2_0, True)
    for broken_off_device in (api.XFormersAttnProcessor, api.AttnProcessorNPU):
        if broken_off_device is not None:
            table[broken_off_device] = (api.default_processor, False)
    return table


def _check_arguments(attention_fn: Any, processor_factory: Any) -> None:
    if processor_factory is not None:
        if not callable(processor_factory):
            raise TypeError(
                "processor_factory must be a zero-argument callable that returns an attention processor; "
                f"got {describe_type(processor_factory)}"
            )
    elif not callable(attention_fn):
        raise TypeError(f"attention_fn must be a callable {ATTENTION_FN_SIGNATURE}; got {describe_type(attention_fn)}")


def _install_custom(
    applied: AppliedAttention, found: List[Tuple[str, nn.Module]], processor_factory: Callable[[], Any]
) -> None:
    owners: Dict[int, str] = {}
    for name, module in found:
        processor = processor_factory()
        if not callable(processor):
            raise TypeError(
                f"processor_factory returned {describe_type(processor)} for {name}, which is not callable; it must "
                "return an attention processor (called as processor(attn, hidden_states, ...))"
            )
        if isinstance(processor, nn.Module):
            if id(processor) in owners:
                raise ValueError(
                    f"processor_factory returned the same torch.nn.Module processor for {owners[id(processor)]} and "
                    f"{name}; it must build a new instance on every call, or the modules would share its weights"
                )
            owners[id(processor)] = name
        applied._record(name, module, getattr(module, "processor", None), "custom", installed=processor)
        module.set_processor(processor)


def _install_routing(
    applied: AppliedAttention,
    found: List[Tuple[str, nn.Module]],
    attention_fn: AttentionFn,
    api: classes.DiffusersClasses,
) -> None:
    standard = _standard_processors(api)
    for name, module in found:
        original = getattr(module, "processor", None)
        spec: Optional[Tuple[type, bool]] = None
        if api.Attention is not None and isinstance(module, api.Attention):
            if type(original) is RoutedAttnProcessor:  # applied twice: stand in for the same thing again
                spec = (original.stands_in_for, original.fused)
            elif type(original) is not api.AttnProcessor or diffusers_scores(module):
                spec = standard.get(type(original))
            # else: AttnProcessor on a module with its own get_attention_scores (attention maps): kept, so that
            # its code runs (the scores routing declines it, and explain() says so)
            if spec is not None and upstream.missing_steps(module):  # something our steps read is not there: kept
                spec = None
        route = Route(attention_fn, name, applied.tally)
        if spec is not None:
            processor = RoutedAttnProcessor(attention_fn, spec[0], spec[1], module_name=name, tally=applied.tally)
            applied._record(name, module, original, "replaced", installed=processor)
            module.set_processor(processor)
        else:
            state, _ = _route_processor(applied.routing, api, name, route, module)
            applied._record(name, module, original, state)
        applied._unwatch.append(watch(module, _follow(applied.routing, api, name, route)))


def _install_legacy(applied: AppliedAttention, legacy: List[Tuple[str, nn.Module]], attention_fn: AttentionFn) -> None:
    """Route the target's legacy attention modules (no processor: their class's ``_attention`` / ``forward``) through
    ``attention_fn``: routed methods on their classes that route only while a targeted module runs, and route hooks
    on each module (see :mod:`npu_port.integrations.legacy_scope`)."""
    from ..legacy_attention.patch import route_target_legacy

    applied.routing.legacy = route_target_legacy(applied.target, legacy)
    for name, module in legacy:
        applied._record(name, module, None, "routed", label=type(module).__name__, legacy=True)
        route = Route(attention_fn, name, applied.tally)
        applied.routing.set_hooks(name, list(install_route_hooks(module, route)))


def _lease(routing: Routing, api: classes.DiffusersClasses) -> PatchLease:
    """The application's shared patches, taken the first time a processor other than ours needs them."""
    if routing.lease is None:
        routing.lease = PatchLease(api.dispatch_attention_fn, stand_ins=_stand_ins(api))
        routing.lease.cover_loaded_diffusers()
    return routing.lease


def _stand_ins(api: classes.DiffusersClasses) -> Dict[type, type]:
    """Standard processors that cannot run off their device -> the processor ours stands in for, for routing them
    in place when one is set after the strategy (see :meth:`PatchLease.cover_processor`)."""
    return {
        broken: stands_in_for
        for broken, (stands_in_for, fused) in _standard_processors(api).items()
        if stands_in_for is not broken and not fused
    }


def _route_processor(
    routing: Routing, api: classes.DiffusersClasses, name: str, route: Route, module: nn.Module
) -> Tuple[str, str]:
    """Route the processor ``module`` has now (ours: nothing to do, and no hooks); its state and what it means."""
    processor = getattr(module, "processor", None)
    if type(processor) is RoutedAttnProcessor:
        routing.drop_hooks(name)
        return "replaced", ""
    lease = _lease(routing, api)
    if processor is not None and lease.dispatch_declined(type(processor)):  # diffusers' own dispatcher runs it
        routing.drop_hooks(name)
        return lease.explain(type(processor))
    if processor is not None:
        lease.cover_processor(type(processor))
    if name not in routing.hooks:
        routing.set_hooks(name, list(install_route_hooks(module, route)))
    return lease.explain(type(processor))


def _follow(routing: Routing, api: classes.DiffusersClasses, name: str, route: Route) -> Callable[[nn.Module], None]:
    """The watcher of one module: a processor set on it later is routed then (hooks and patches when it is not
    ours; when ours comes back, the hooks go again). Holds neither the module nor the application's processors
    (see :mod:`.watch`): only the routing state."""

    def on_new_processor(module: nn.Module) -> None:
        if not routing.restored:
            _route_processor(routing, api, name, route, module)

    return on_new_processor


def _declined_pipeline(target: Any, custom: bool) -> AppliedAttention:
    """A pipeline that is not a ``DiffusionPipeline`` as found: the class moved (declined, the pipeline left as it
    is), or it is something else (the usual error). A custom processor asked for explicitly is refused."""
    if custom:
        upstream.require(upstream.PIPELINES, "DiffusionPipeline")
    declined = upstream.decline(upstream.PIPELINES, "DiffusionPipeline")
    if declined is None:  # DiffusionPipeline is there, and this is not one: what a target may be
        components(target, classes.load())
    applied = AppliedAttention(target)
    applied.declines.append(declined)
    return applied


def apply_to_target(
    target: Any, attention_fn: Optional[AttentionFn], *, processor_factory: Optional[Callable[[], Any]] = None
) -> AppliedAttention:
    """Send every diffusers attention computation in ``target`` to ``attention_fn``; undo with ``.restore()``.

    ``target``: a diffusers model (``ModelMixin``), a ``DiffusionPipeline`` (each ``torch.nn.Module`` component), or
    a ``torch.nn.Module`` containing diffusers ``Attention`` / ``AttentionModuleMixin`` modules or legacy attention
    (routed too: :func:`_install_legacy`); anything else raises :class:`TypeError`, and a target with no attention
    module of either kind (nor, for a pipeline, a text encoder) raises :class:`ValueError`. A pipeline's
    transformers components (text encoders) are routed too, through transformers' attention interface
    (:mod:`npu_port.integrations.transformers_attention`), and restored with the rest.

    ``attention_fn(query, key, value, attn_mask=None, *, dropout_p=0.0, is_causal=False, scale=None,
    enable_gqa=False)``: exactly ``torch.nn.functional.scaled_dot_product_attention``'s semantics, ``(B, H, S, D)``
    layout (e.g. ``functools.partial(npu_port.attention, kernel="chunked")``).

    ``processor_factory``: a zero-argument callable; when given, every attention module gets a new processor from
    it (the ``custom-processor`` strategy) and ``attention_fn`` is not used (may be None).

    Returns an :class:`~.applied.AppliedAttention` (what changed, call counts, ``restore()``). If anything fails
    part-way, what was already changed is undone and the error propagates.
    """
    from ..transformers_attention import apply_to_transformers, text_models  # it imports .routing: not at the top

    _check_arguments(attention_fn, processor_factory)
    api = classes.load()
    if unrecognised_pipeline(target, api):
        return _declined_pipeline(target, custom=processor_factory is not None)
    text: List[Tuple[str, Any]] = []
    if processor_factory is None and is_pipeline(target, api):
        text = text_models(components(target, api))
    found, legacy = find_attention(target, api, others=bool(text), declined=bool(upstream.missing(upstream.MODULES)))
    if processor_factory is not None and not found:
        if legacy:
            kinds = ", ".join(sorted({type(module).__name__ for _, module in legacy}))
            raise ValueError(LEGACY_ONLY.format(name=type(target).__name__, classes=kinds))
        upstream.require(upstream.MODULES)  # attention modules there, of a class the adapter cannot find: refused
    applied = AppliedAttention(target)
    if processor_factory is None:
        applied.declines.extend(upstream.routing_declines())
    else:
        applied.declines.extend(d for d in (upstream.decline(upstream.MODULES),) if d is not None)
    try:
        if processor_factory is not None:
            _install_custom(applied, found, processor_factory)
            for name, module in legacy:
                applied._record(name, module, None, "kept", label=type(module).__name__, legacy=True)
        else:
            _install_routing(applied, found, attention_fn, api)  # type: ignore[arg-type]
            if legacy:
                _install_legacy(applied, legacy, attention_fn)  # type: ignore[arg-type]
            if text:  # the pipeline's transformers components: routed through transformers' AttentionInterface
                applied.text = apply_to_transformers(target, attention_fn, models=text, tally=applied.tally)
    except BaseException:
        applied.restore()
        raise
    return applied
