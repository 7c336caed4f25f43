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
    kinds: Iterable[str], layouts: Iterable[Tuple[int, int]], guided: Iterable[Tuple[int, int]] = ()
) -> Dict[str, Any]:
    """For each model kind: its outputs on this rank alone, then for each ``(ulysses, ring)`` layout, parallelized:
    every mask variant's output and the bytes this rank sent during that forward; after ``restore()``, the outputs
    and the attention state again. ``guided``: ``(ulysses, ring)`` layouts run with CFG parallelism on top (see
    :func:`guided_context_parallel`)."""
    from npu_port.parallel import TRAFFIC, start

    alone, parallel, restored, state = {}, {}, {}, {}
    for kind in kinds:
        model = models.build(kind)
        state[kind, "before"] = attention_state(model)
        for mask in models.MASKS[kind]:
            alone[kind, mask] = models.run(model, kind, mask)
        for ulysses, ring in layouts:
            session = start(ulysses=ulysses, ring=ring)
            handle = session.parallelize(model)
            state[kind, ulysses, ring, "parallel"] = attention_state(model)
            for mask in models.MASKS[kind]:
                TRAFFIC.reset()
                out = models.run(model, kind, mask)
                parallel[kind, ulysses, ring, mask] = {"out": out, "traffic": TRAFFIC.snapshot()}
            handle.restore()
            session.close()
            state[kind, ulysses, ring, "restored"] = attention_state(model)
            for mask in models.MASKS[kind]:
                restored[kind, ulysses, ring, mask] = models.run(model, kind, mask)
    results = {"alone": alone, "parallel": parallel, "restored": restored, "state": state}
    results["guided"] = {layout: guided_context_parallel(*layout) for layout in guided}
    return results


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
