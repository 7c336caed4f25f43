"""``npu-port infer --nproc N``: one generation over N ranks (context parallelism, CFG parallelism), started through
torchrun's launcher API (:mod:`npu_port.parallel.launch`).

Every rank loads the pipeline on its own device, joins the layout (:func:`npu_port.parallel.start`), makes the
pipeline parallel and generates with the same seed; rank 0 returns the image, every rank its timings and the bytes
it sent. The calling process writes the image and the report once, through the same code as a single-process run.
The built-in tiny models are built here first, so ranks never race to build them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from ..errors import ParallelError
from .models import TINY_MODELS, describe_model, tiny_model_dir
from .paths import CacheLocation
from .run import GenerationRequest, GenerationResult


@dataclass(frozen=True)
class RankJob:
    """What each rank is asked to do (picklable: it crosses into spawned processes)."""

    model: str
    device_type: str
    dtype: str
    request: Dict[str, Any]
    ulysses: int
    ring: int
    cfg: bool
    cache_root: Optional[str]
    progress: bool
    anything: bool = False  # --ulysses-anything
    profile: Optional[str] = None  # --profile: its Ascend options are process-local, so each rank applies them


def _quiet_diffusers() -> None:
    """One "experimental" warning per rank per model, and one deprecation warning per rank from diffusers' own
    gather, say nothing the report does not."""
    import warnings

    from ..upstream.diffusers.pipelines import logging_module

    warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)
    logging = logging_module()
    if logging is not None:
        logging.set_verbosity_error()


def _no_loading_bars() -> None:
    """The weight-loading bars of every rank but the one that shows progress."""
    from ..upstream.diffusers.pipelines import logging_module as diffusers_logging
    from ..upstream.transformers import logging_module as transformers_logging

    for logging in (diffusers_logging(), transformers_logging() if _transformers_installed() else None):
        if logging is not None:
            logging.disable_progress_bar()


def _transformers_installed() -> bool:
    from ..upstream.transformers import ADAPTER

    return ADAPTER.version() is not None


def run_rank(job: RankJob) -> Dict[str, Any]:
    """One rank's whole part (the launcher's entry point). Any error is raised: the launcher stops the other ranks
    (which may be waiting in a collective) and reports the first failure in one line."""
    import torch

    from ..parallel import TRAFFIC, ParallelLayout, start
    from .models import load_pipeline
    from .run import generate

    _quiet_diffusers()
    npu_options = None
    if job.profile:
        from ..npu_setup import apply_npu_options

        npu_options = apply_npu_options(job.profile).as_dict()  # before the device is used, as in one process
    session = start(ParallelLayout(job.ulysses, job.ring, job.cfg), device=job.device_type)
    try:
        if not (job.progress and session.is_main):
            _no_loading_bars()
        cache = CacheLocation(None if job.cache_root is None else Path(job.cache_root))
        loaded = load_pipeline(
            job.model,
            session.device,
            getattr(torch, job.dtype),
            progress_bar=job.progress and session.is_main,
            cache=cache,
        )
        session.parallelize(loaded.pipe, anything=job.anything)
        TRAFFIC.reset()
        result = generate(loaded, GenerationRequest(**job.request))
        steps = len(result.step_s) + 1
        return {
            "rank": session.rank,
            "device": str(session.device),
            "image": result.image if session.is_main else None,
            "result": {k: v for k, v in asdict(result).items() if k != "image"},
            "npu_options": npu_options,
            "timing": result.as_dict()["time"],
            "traffic": TRAFFIC.snapshot(),
            "bytes_sent_per_step": TRAFFIC.total_bytes / steps,
        }
    finally:
        if session is not None:
            session.close()


def split_sequences(config: Dict[str, Any], limits: Any, request: GenerationRequest) -> Dict[str, int]:
    """The sequences a Flux- or Wan-style ``_cp_plan`` splits, with their lengths for ``request`` (sizes left out
    take the model's defaults; empty when they are not known before loading)."""
    defaults = limits.call_defaults if limits is not None else {}
    height, width = request.height or defaults.get("height"), request.width or defaults.get("width")
    if not height or not width or limits is None:
        return {}
    patches = (height // limits.factor) * (width // limits.factor)
    if "joint_attention_dim" in config:  # Flux: image tokens and text tokens are both split
        found = {"the image tokens": patches}
        if "max_sequence_length" in defaults:
            found["the text tokens"] = defaults["max_sequence_length"]
        return found
    if isinstance(config.get("patch_size"), list) and len(config["patch_size"]) == 3:  # Wan: the video tokens
        frames = getattr(request, "frames", None) or defaults.get("num_frames")
        if frames:
            latent_frames = (frames - 1) // max(limits.frame_factor, 1) + 1
            return {"the video tokens": latent_frames // config["patch_size"][0] * patches}
    return {}


def check_parallel_model(
    model: str, layout: Any, request: Optional[GenerationRequest] = None, anything: bool = False
) -> None:
    """What can be known before any rank starts: the model's denoiser has a context-parallel plan (when the layout
    splits the sequence), its heads split over the Ulysses degree and, for Flux- and Wan-style models, the request's
    sequences split over the ranks — read from the built-in model's or the directory's config files."""
    from ..parallel.layout import check_heads, check_sequence, planned_models_text
    from ..upstream.diffusers.parallel import cp_plan

    plan = describe_model(model)
    if not plan.builtin and not os.path.isdir(plan.source):
        return
    import json

    root = str(tiny_model_dir(model)) if plan.builtin else plan.source
    for part in ("transformer", "unet"):
        path = os.path.join(root, part, "config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                config = json.load(fh)
            break
    else:
        return
    if layout.cfg and config.get("guidance_embeds"):
        raise ParallelError(
            f"{model!r}: its {config.get('_class_name', 'transformer')} is guidance-distilled (guidance_embeds): the "
            "pipeline calls it once per step, so --cfg-parallel has no second half to run; use --ulysses / --ring"
        )
    if not layout.context_parallel:
        return
    import diffusers

    cls = getattr(diffusers, config.get("_class_name", ""), None)
    if cls is not None and not cp_plan(cls):
        raise ParallelError(
            f"{model!r}: its {config['_class_name']} has no context-parallel plan (_cp_plan), so --ulysses / --ring "
            f"cannot split it; {planned_models_text()} (built in: "
            f"{', '.join(n for n in TINY_MODELS if n in ('tiny-flux', 'tiny-wan'))}); --cfg-parallel alone works "
            "for any guided pipeline"
        )
    heads = config.get("num_attention_heads")
    if isinstance(heads, int):
        check_heads(heads, layout, anything)
    if request is not None:
        for name, length in split_sequences(config, plan.limits, request).items():
            check_sequence(f"{model!r} at this size: {name}", length, layout)


def run_parallel(
    model: str,
    device_type: str,
    dtype: str,
    request: GenerationRequest,
    layout: Any,
    cache: CacheLocation,
    progress: bool,
    on_build: Any = None,
    anything: bool = False,
    profile: Optional[str] = None,
) -> tuple:
    """Generate over ``layout.world`` ranks; returns (rank 0's :class:`GenerationResult`, per-rank summaries)."""
    from ..device.helpers import device_count
    from ..parallel.launch import launch, rank_environment
    from ..parallel.layout import require

    require(layout, anything)  # diffusers has what the layout needs: before anything is built or started
    if layout.cfg and request.guidance_scale <= 1:
        raise ParallelError(
            "--cfg-parallel splits classifier-free guidance, which is off at --guidance-scale "
            f"{request.guidance_scale:g}; use a scale > 1 or leave --cfg-parallel out"
        )
    if describe_model(model).builtin:
        tiny_model_dir(model, on_build, cache)
    check_parallel_model(model, layout, request, anything)
    visible = None if device_type == "cpu" else device_count(device_type)
    env = rank_environment(device_type, layout.world, visible)
    job = RankJob(
        model,
        device_type,
        dtype,
        asdict(request),
        layout.ulysses,
        layout.ring,
        layout.cfg,
        None if cache.root is None else str(cache.root),
        progress,
        anything,
        profile,
    )
    returned = launch(run_rank, (job,), layout.world, env)
    ranks: List[Dict[str, Any]] = [returned[r] for r in sorted(returned)]
    main = ranks[0]
    fields = dict(main["result"], image=np.asarray(main["image"]))
    result = GenerationResult(**fields)
    result.details["npu_options"] = main["npu_options"]
    summaries = [
        {
            "rank": r["rank"],
            "device": r["device"],
            **r["timing"],
            "bytes_sent": sum(r["traffic"]["bytes"].values()),
            "bytes_sent_per_step": r["bytes_sent_per_step"],
            "collectives": r["traffic"]["calls"],
        }
        for r in ranks
    ]
    return result, summaries


def rank_lines(summaries: List[Dict[str, Any]]) -> List[str]:
    """The per-rank timing report, one line a rank."""
    lines = []
    for s in summaries:
        step = s.get("median_step_s")
        step_text = f"{step * 1e3:.1f} ms/step" if step is not None else "one step"
        lines.append(
            f"  rank {s['rank']} ({s['device']}): first step {s['first_step_s']:.3f} s, {step_text}, total "
            f"{s['total_s']:.3f} s, sent {s['bytes_sent_per_step'] / 2**20:.2f} MiB/step"
        )
    return lines
