"""What each rank runs (started by :func:`tests.parallel.conftest.run_ranks`): one spawn runs every case of a test
module, and returns plain tensors and dicts for the test to check in its own process."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Tuple

import torch

from . import models


def attention_state(model: torch.nn.Module) -> Dict[str, Any]:
    """What parallelizing changes and ``restore()`` must put back: each processor's backend and parallel config,
    the diffusers hook registries and instance ``forward`` attributes on every submodule, the model's own parallel config,
    and whether the backend is in diffusers' registry."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    from npu_port.parallel import backend

    processors = [
        (type(p).__name__, getattr(p._attention_backend, "value", p._attention_backend), repr(p._parallel_config))
        for p in backend.attention_processors(model)
    ]
    hooks = {}
    for name, module in model.named_modules():
        registry = vars(module).get("_diffusers_hook")
        if registry is not None:  # restore() removes the registries it made, emptied or not
            hooks[name or "<model>"] = list(registry._hook_order)
        if "forward" in vars(module):  # ...and the instance forward diffusers' hooks leave behind
            hooks[f"{name or '<model>'}.forward"] = ["instance forward"]
    return {
        "processors": processors,
        "hooks": hooks,
        "model_parallel_config": "_parallel_config" in vars(model),
        "registered": backend.registered(),
        "enum_member": "NPU_PORT" in AttentionBackendName.__members__,
    }


def context_parallel(
    kinds: Iterable[str],
    layouts: Iterable[Tuple[int, int]],
    guided: Iterable[Tuple[int, int]] = (),
    cases: bool = False,
) -> Dict[str, Any]:
    """For each model kind: its outputs on this rank alone, then for each ``(ulysses, ring)`` layout, parallelized:
    every mask variant's output and the bytes this rank sent during that forward; after ``restore()``, the outputs
    and the attention state again, and after ``close()`` the process groups left (:func:`closed`). ``cases``: then
    per layout the cases of :func:`flux_cases` and :func:`two_transformers`. ``guided``: ``(ulysses, ring)`` layouts run with
    CFG parallelism on top (see :func:`guided_context_parallel`)."""
    from npu_port.parallel import TRAFFIC, start

    alone, parallel, restored, state, groups = {}, {}, {}, {}, {}
    for kind in kinds:
        model = models.build(kind)
        state[kind, "before"] = attention_state(model)
        for mask in models.MASKS[kind]:
            alone[kind, mask] = models.run(model, kind, mask)
        for ulysses, ring in layouts:
            groups_before = process_groups()
            session = start(ulysses=ulysses, ring=ring)
            handle = session.parallelize(model)
            state[kind, ulysses, ring, "parallel"] = attention_state(model)
            for mask in models.MASKS[kind]:
                TRAFFIC.reset()
                out = models.run(model, kind, mask)
                parallel[kind, ulysses, ring, mask] = {"out": out, "traffic": TRAFFIC.snapshot()}
            handle.restore()
            groups[kind, ulysses, ring] = closed(session, groups_before)
            state[kind, ulysses, ring, "restored"] = attention_state(model)
            for mask in models.MASKS[kind]:
                restored[kind, ulysses, ring, mask] = models.run(model, kind, mask)
    results = {"alone": alone, "parallel": parallel, "restored": restored, "state": state, "groups": groups}
    if cases:
        results["flux cases"] = {(u, r): flux_cases(u, r) for u, r in layouts}
        results["two transformers"] = {(u, r): two_transformers(u, r) for u, r in layouts}
    results["guided"] = {layout: guided_context_parallel(*layout) for layout in guided}
    return results


def process_groups() -> int:
    """The process groups this rank is a member of (torch.distributed's own table: the WORLD group and subgroups)."""
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def guided_context_parallel(ulysses: int, ring: int) -> Dict[str, Any]:
    """CFG parallelism on top of context parallelism: the masked Flux model's guided latents on this rank alone,
    with each guidance half split over ``ulysses x ring`` ranks, and after ``restore()``."""
    from npu_port.parallel import start

    model = models.build("flux")
    alone = models.flux_guidance(model)
    session = start(ulysses=ulysses, ring=ring, cfg_parallel=True)
    handle = session.parallelize(model, cfg_mode="alternate")
    out = models.flux_guidance(model)
    exchanges = handle.cfg.exchanges
    session.close()
    return {"alone": alone, "out": out, "exchanges": exchanges, "restored": models.flux_guidance(model)}


def guidance_halves() -> Dict[str, Any]:
    """CFG parallel on 2 ranks, for each way pipelines run guidance: the final latents on this rank alone, then with
    one guidance half per rank (and what the pipeline saw between a step's two calls), the exchanges and bytes, and
    the latents after ``restore()``."""
    from npu_port.parallel import TRAFFIC, start

    session = start(cfg_parallel=True)
    results = {}
    for mode, loop in models.GUIDANCE.items():
        model = models.TinyDenoiser()
        alone, _ = loop(model)
        handle = session.parallelize(model, cfg_mode=mode)
        TRAFFIC.reset()
        out, seen = loop(model)
        exchanges, traffic = handle.cfg.exchanges, TRAFFIC.snapshot()
        handle.restore()
        restored, _ = loop(model)
        results[mode] = {
            "cfg_rank": session.cfg_rank,
            "alone": alone,
            "out": out,
            "seen": seen,
            "exchanges": exchanges,
            "traffic": traffic,
            "restored": restored,
        }
    model = models.ConditionedDenoiser()
    alone = models.conditioned_guidance(model)
    handle = session.parallelize(model, cfg_mode="alternate")
    results["conditioned"] = {"alone": alone, "out": outcome(lambda: models.conditioned_guidance(model))}
    handle.restore()
    results["named"] = guidance_by_name(session)
    results["sdxl"] = nested_batch(session)
    session.close()
    return results


def outcome(run: Callable[[], Any]) -> Any:
    """``run()``, or ``{"error": "Type: message"}`` when it raises: a case that fails (the same way on every rank,
    before any collective) is one failed check, not a failed spawn."""
    try:
        return run()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def guidance_by_name(session: Any) -> Dict[str, Any]:
    """Alternate CFG told apart by diffusers' cache-context names (:func:`.models.named_guidance`): a guided run,
    a guidance-off run (refused, not NaN), a guided run straight after it (the off run left a conditional half
    behind), then after ``handle.reset()``; an interrupted run, then after ``reset()`` again."""
    model = models.TinyDenoiser()
    alone = models.named_guidance(model)
    handle = session.parallelize(model, cfg_mode="alternate")
    found = {"alone": alone, "guided": outcome(lambda: models.named_guidance(model))}
    found["off"] = outcome(lambda: models.named_guidance(model, guided=False))
    found["stale"] = outcome(lambda: models.named_guidance(model))
    found["reset"] = outcome(lambda: (handle.reset(), models.named_guidance(model))[1])
    found["interrupted"] = outcome(lambda: models.named_guidance(model, interrupt_at=1))
    found["after interrupt"] = outcome(lambda: (handle.reset(), models.named_guidance(model))[1])
    handle.restore()
    return found


def nested_batch(session: Any) -> Dict[str, Any]:
    """Batch CFG on an SDXL-style UNet, whose ``added_cond_kwargs`` dict carries the doubled batch too: one
    process's output, the parallel one, and the exchanges."""
    unet = models.sdxl_unet()
    alone = models.sdxl_guidance_call(unet)
    handle = session.parallelize(unet, cfg_mode="batch")
    out = outcome(lambda: models.sdxl_guidance_call(unet))
    exchanges = handle.cfg.exchanges
    handle.restore()
    return {"alone": alone, "out": out, "exchanges": exchanges}


def closed(session: Any, groups_before: int) -> Dict[str, Any]:
    """``session.close()`` in a process group the caller made (the harness's): the groups this rank was in before
    ``start``, while the session was open and after ``close``, an all-reduce over the WORLD group afterwards, and
    what a second ``close()`` does."""
    import torch.distributed as dist

    during = process_groups()
    session.close()
    total = torch.ones(1)
    dist.all_reduce(total)
    return {
        "before": groups_before,
        "during": during,
        "after": process_groups(),
        "owns_group": session.owns_group,
        "world all_reduce": total.item(),
        "second close": outcome(session.close),  # None: closing again does nothing, as restore() again does
    }


def flux_cases(ulysses: int, ring: int) -> Dict[str, Any]:
    """The masked Flux model on one layout: ``anything=True`` (refused with ring > 1, the model left as it was);
    a text mask made under ``torch.inference_mode()``; and every mask variant with a strategy whose kernel cannot
    return the log-sum-exp (SDPA pinned to its math backend: Ulysses alone needs none, ring refuses), with the
    kernels it ran."""
    import npu_port
    from npu_port.parallel import start

    session = start(ulysses=ulysses, ring=ring)
    found: Dict[str, Any] = {}
    if ring > 1:
        model = models.build("flux")
        before = attention_state(model)
        found["anything"] = outcome(lambda: session.parallelize(model, anything=True) and "parallelized")
        found["anything left"] = attention_state(model) == before
    model = models.build("flux")  # each case on a model of its own: one that fails leaves the next one untouched
    handle = session.parallelize(model)
    block = model.transformer_blocks[0].attn
    kept = block.processor
    block.processor = type(kept)()  # replaced after parallelize: a fresh processor on diffusers' default backend
    found["replaced processor"] = outcome(lambda: model(**models.flux_inputs(masked=True))[0])
    block.processor = kept
    with torch.inference_mode():
        found["inference mode"] = outcome(lambda: model(**models.flux_inputs(masked=True))[0])
    handle.restore()
    model = models.build("flux")
    strategy = npu_port.set_attention_strategy("sdpa", target=model, sdpa_backends=["math"])
    handle = session.parallelize(model)
    found["no lse"] = {m: outcome(lambda m=m: models.run(model, "flux", m)) for m in models.MASKS["flux"]}
    found["no lse kernels"] = dict(strategy.calls)
    handle.restore()
    strategy.restore()
    session.close()
    return found


def _record_lengths(attention: torch.nn.Module, lengths: set) -> Any:
    """Add the sequence length of each call of ``attention`` to ``lengths``; returns the hook's handle."""

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        lengths.add((args[0] if args else kwargs["hidden_states"]).shape[1])

    return attention.register_forward_pre_hook(record, with_kwargs=True)


def two_transformers(ulysses: int, ring: int) -> Dict[str, Any]:
    """A Wan 2.2-style pipeline (``transformer`` for high noise, ``transformer_2`` for low noise, other weights):
    each one's video-masked output alone and parallelized, the sequence length its first self-attention saw, and
    its attention state before, during and after ``restore()``."""
    from types import SimpleNamespace

    from npu_port.parallel import start

    pipe = SimpleNamespace(transformer=models.wan_model(), transformer_2=models.wan_model(seed=1))
    names = ("transformer", "transformer_2")
    seen: Dict[str, set] = {name: set() for name in names}
    hooks = [_record_lengths(getattr(pipe, name).blocks[0].attn1, seen[name]) for name in names]
    found: Dict[str, Any] = {name: {"before": attention_state(getattr(pipe, name))} for name in names}
    for name in names:
        found[name]["alone"] = models.run(getattr(pipe, name), "wan", "video")
        found[name]["alone seen"] = set(seen[name])
        seen[name].clear()
    session = start(ulysses=ulysses, ring=ring)
    handle = session.parallelize(pipe)
    for name in names:
        found[name]["parallel state"] = attention_state(getattr(pipe, name))
        found[name]["out"] = models.run(getattr(pipe, name), "wan", "video")
        found[name]["seen"] = set(seen[name])
    handle.restore()
    session.close()
    for hook in hooks:
        hook.remove()
    for name in names:
        found[name]["restored"] = attention_state(getattr(pipe, name))
    return found
