"""One image (or video), measured: time of the first step (set-up, encoding and first-call costs) apart from the
steady steps, the total, and peak memory — with the attention strategy applied for the run and restored afterwards.

An image with NaN or inf in it is reported as not finite (:attr:`GenerationResult.finite`): callers fail closed on
it rather than save a black picture as if it were a result.
"""

from __future__ import annotations

import inspect
import resource
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from .. import device as devices
from ..device.timing import stamp
from ..errors import InferenceError
from .deadline import Deadline
from .limits import CLASS_CONDITIONAL, TEXT_TO_VIDEO
from .models import LoadedPipeline


@dataclass
class GenerationRequest:
    """What to generate: a prompt (text-to-image or -video) or a class id (class-conditional), and how. ``height``,
    ``width`` and ``frames`` (video only) left out: the model's defaults."""

    prompt: str = "a lighthouse at dusk, oil painting"
    negative_prompt: Optional[str] = None
    class_label: int = 1
    steps: int = 10
    seed: int = 0
    height: Optional[int] = None
    width: Optional[int] = None
    guidance_scale: float = 4.0
    strategy: str = "auto"
    vae_slicing: bool = False
    vae_tiling: bool = False
    frames: Optional[int] = None


@dataclass
class GenerationResult:
    """The image (H, W, 3 floats in [0, 1]) — for a video model the video, (F, H, W, 3) — and what the report says
    about how it was made."""

    image: np.ndarray
    strategy_requested: str
    strategy_resolved: str
    strategy_explanation: str
    first_step_s: float
    step_s: List[float]
    total_s: float
    peak_memory: Dict[str, Any]
    details: Dict[str, Any] = field(default_factory=dict)

    @property
    def median_step_s(self) -> Optional[float]:
        return float(np.median(self.step_s)) if self.step_s else None

    @property
    def non_finite(self) -> int:
        """How many of the image's values are NaN or inf (0 for a usable image)."""
        return int(self.image.size - np.count_nonzero(np.isfinite(self.image)))

    @property
    def finite(self) -> bool:
        return self.non_finite == 0

    def as_dict(self) -> Dict[str, Any]:
        return {
            "finite": self.finite,
            "non_finite_values": self.non_finite,
            "strategy": {
                "requested": self.strategy_requested,
                "resolved": self.strategy_resolved,
                "explanation": self.strategy_explanation,
            },
            "time": {
                "first_step_s": self.first_step_s,
                "median_step_s": self.median_step_s,
                "steps_after_first_s": self.step_s,
                "total_s": self.total_s,
            },
            "peak_memory": self.peak_memory,
            **self.details,
        }


def check_request(loaded: LoadedPipeline, request: GenerationRequest) -> None:
    """Refuse what the pipeline cannot do, with the valid range, before any work starts (its
    :class:`~npu_port.infer.limits.ModelLimits`)."""
    loaded.limits.check(request)


def _peak_memory(device: torch.device) -> Dict[str, Any]:
    if device.type == "cpu":
        # No device allocator on a CPU: the process's peak resident memory (Linux reports KiB; macOS bytes).
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return {"bytes": int(peak), "what": "peak resident memory of this process (cpu)"}
    return {"bytes": devices.max_memory_allocated(device), "what": f"torch.{device.type}.max_memory_allocated()"}


class _StepClock:
    """Timestamps the end of every denoising step by wrapping the scheduler's ``step`` (one call per step in every
    diffusers pipeline), synchronising the device first so that the time is the work's, not the launch's."""

    def __init__(self, pipe: Any, device: torch.device, deadline: Optional[Deadline], request: GenerationRequest):
        self.scheduler = pipe.scheduler
        self.device = device
        self.deadline = deadline
        self.request = request
        self.ends: List[float] = []

    def __enter__(self) -> "_StepClock":
        step = self.scheduler.step

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            self.ends.append(stamp(self.device))
            if self.deadline is not None:
                self.deadline.check(len(self.ends), self.request.steps, self.request.strategy)
            return out

        self.scheduler.step = timed_step
        return self

    def __exit__(self, *exc_info: Any) -> None:
        del self.scheduler.step  # the instance attribute goes; the class's method shows through again


def _true_cfg(pipe: Any) -> bool:
    """Flux-style pipelines run classifier-free guidance only as "true CFG" (``true_cfg_scale`` > 1 and a negative
    prompt); a transformer without a guidance embedding has no other use for the guidance scale, so the request's
    guidance becomes that: each step calls the transformer twice, conditional then unconditional."""
    transformer = getattr(pipe, "transformer", None)
    return (
        "true_cfg_scale" in inspect.signature(pipe.__call__).parameters
        and transformer is not None
        and not transformer.config.get("guidance_embeds", False)
    )


def call_arguments(loaded: LoadedPipeline, request: GenerationRequest, generator: torch.Generator) -> Dict[str, Any]:
    pipe = loaded.pipe
    arguments: Dict[str, Any] = {
        "num_inference_steps": request.steps,
        "generator": generator,
        "output_type": "np",
        "guidance_scale": request.guidance_scale,
    }
    if loaded.kind == CLASS_CONDITIONAL:
        arguments["class_labels"] = [request.class_label]
        return arguments
    defaults = loaded.limits.call_defaults
    asked = {"height": request.height, "width": request.width}
    if loaded.kind == TEXT_TO_VIDEO:
        asked["num_frames"] = request.frames
    for name, value in asked.items():
        value = defaults.get(name) if value is None else value
        if value is not None:  # else the pipeline's own default
            arguments[name] = value
    if "max_sequence_length" in defaults:
        arguments["max_sequence_length"] = defaults["max_sequence_length"]
    negative = request.negative_prompt
    if _true_cfg(pipe):
        arguments["true_cfg_scale"] = request.guidance_scale
        negative = negative or ""  # true CFG runs only with a negative prompt: the empty one, as CFG means
    if loaded.text_encoder_device is None:
        arguments.update(prompt=request.prompt, negative_prompt=negative)
        return arguments
    # --text-encoder-device: encode where the encoder lives, move only the embeddings (as the TPU / NPU ports do)
    with torch.no_grad():
        positive, negative = pipe.encode_prompt(
            request.prompt, loaded.text_encoder_device, 1, request.guidance_scale > 1, request.negative_prompt
        )
    arguments["prompt_embeds"] = positive.to(loaded.device, loaded.dtype)
    if negative is not None:
        arguments["negative_prompt_embeds"] = negative.to(loaded.device, loaded.dtype)
    return arguments


def _set_vae_switches(vae: Any, request: GenerationRequest) -> None:
    if request.vae_slicing:
        vae.enable_slicing()
    else:
        vae.disable_slicing()
    if request.vae_tiling:
        vae.enable_tiling()
    else:
        vae.disable_tiling()


def generate(
    loaded: LoadedPipeline, request: GenerationRequest, *, deadline: Optional[Deadline] = None
) -> GenerationResult:
    """Generate one image (or video) under ``request.strategy``; the strategy is restored afterwards, whatever
    happens.

    ``deadline``: stop (:class:`~npu_port.infer.deadline.RequestTimeout`) at the first step boundary past it.
    """
    from ..strategy.api import set_attention_strategy

    check_request(loaded, request)
    pipe = loaded.pipe
    _set_vae_switches(pipe.vae, request)  # both ways: the pipeline is reused across requests (the demo)
    # no writable cache folder: auto keeps its decisions in memory instead of trying the disk at every new shape
    overrides = {} if loaded.disk_cache else {"cache": False}
    handle = set_attention_strategy(request.strategy, target=pipe, **overrides)
    try:
        if loaded.device.type != "cpu":
            devices.reset_peak_memory_stats(loaded.device)
        start = stamp(loaded.device)
        with _StepClock(pipe, loaded.device, deadline, request) as clock, torch.no_grad():
            generator = torch.Generator("cpu").manual_seed(request.seed)  # same start on every device
            output = pipe(**call_arguments(loaded, request, generator))
        end = stamp(loaded.device)
        explanation = handle.explain()
        resolved = handle.name
    finally:
        handle.restore()
    ends = clock.ends
    if not ends:
        raise InferenceError(f"{type(pipe).__name__} ran no scheduler step; cannot time it")
    video = loaded.kind == TEXT_TO_VIDEO
    image = np.asarray((output.frames if video else output.images)[0], dtype=np.float32)
    details: Dict[str, Any] = {"decode_s": end - ends[-1], "image_size": list(image.shape[-3:-1])}
    if video:
        details["frames"] = int(image.shape[0])
    return GenerationResult(
        image=image,
        strategy_requested=request.strategy,
        strategy_resolved=resolved,
        strategy_explanation=explanation,
        first_step_s=ends[0] - start,
        step_s=[later - earlier for earlier, later in zip(ends, ends[1:])],
        total_s=end - start,
        peak_memory=_peak_memory(loaded.device),
        details=details,
    )


def to_pil(image: np.ndarray):
    """An (H, W, 3) float image in [0, 1] as a PIL image."""
    from PIL import Image

    return Image.fromarray((np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8))
