"""One image, measured: time of the first step (set-up, encoding and first-call costs) apart from the steady steps,
the total, and peak memory — with the attention strategy applied for the run and restored afterwards."""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from .. import device as devices
from ..errors import InferenceError
from .models import LoadedPipeline

#: Bounds that keep one request from running the machine out of memory or time (the demo enforces them too).
MAX_STEPS = 200
MAX_SIDE = 2048


@dataclass
class GenerationRequest:
    """What to generate: a prompt (text-to-image) or a class id (class-conditional), and how."""

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


@dataclass
class GenerationResult:
    """The image (H, W, 3 floats in [0, 1]) and what the report says about how it was made."""

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

    def as_dict(self) -> Dict[str, Any]:
        return {
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
    """Refuse what the pipeline cannot do, with the valid range, before any work starts."""
    if not 1 <= request.steps <= MAX_STEPS:
        raise InferenceError(f"steps must be between 1 and {MAX_STEPS}, got {request.steps}")
    factor = loaded.vae_scale_factor
    for name in ("height", "width"):
        value = getattr(request, name)
        if value is None:
            continue
        if loaded.native_size is not None and value != loaded.native_size:
            raise InferenceError(
                f"{name} {value}: this class-conditional DiT makes {loaded.native_size}x{loaded.native_size} images "
                "only (its transformer's sample size fixes it); leave --height/--width out"
            )
        if not factor <= value <= MAX_SIDE or value % factor:
            raise InferenceError(
                f"{name} must be a multiple of {factor} between {factor} and {MAX_SIDE} for this model, got {value}"
            )
    if loaded.kind == "class-conditional":
        classes = int(loaded.pipe.transformer.config.num_embeds_ada_norm or 0)
        if classes and not 0 <= request.class_label < classes:
            raise InferenceError(f"class must be between 0 and {classes - 1} for this model, got {request.class_label}")


def _peak_memory(device: torch.device) -> Dict[str, Any]:
    if device.type == "cpu":
        # No device allocator on a CPU: the process's peak resident memory (Linux reports KiB; macOS bytes).
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return {"bytes": int(peak), "what": "peak resident memory of this process (cpu)"}
    return {"bytes": devices.max_memory_allocated(device), "what": f"torch.{device.type}.max_memory_allocated()"}


class _StepClock:
    """Timestamps the end of every denoising step by wrapping the scheduler's ``step`` (one call per step in every
    diffusers pipeline), synchronising the device first so that the time is the work's, not the launch's."""

    def __init__(self, pipe: Any, device: torch.device):
        self.scheduler = pipe.scheduler
        self.device = device
        self.ends: List[float] = []

    def __enter__(self) -> "_StepClock":
        step = self.scheduler.step

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            devices.synchronize(self.device)
            self.ends.append(time.perf_counter())
            return out

        self.scheduler.step = timed_step
        return self

    def __exit__(self, *exc_info: Any) -> None:
        del self.scheduler.step  # the instance attribute goes; the class's method shows through again


def _call_arguments(loaded: LoadedPipeline, request: GenerationRequest, generator: torch.Generator) -> Dict[str, Any]:
    pipe = loaded.pipe
    arguments: Dict[str, Any] = {
        "num_inference_steps": request.steps,
        "generator": generator,
        "output_type": "np",
        "guidance_scale": request.guidance_scale,
    }
    if loaded.kind == "class-conditional":
        arguments["class_labels"] = [request.class_label]
        return arguments
    arguments.update(height=request.height, width=request.width)
    if loaded.text_encoder_device is None:
        arguments.update(prompt=request.prompt, negative_prompt=request.negative_prompt)
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


def generate(loaded: LoadedPipeline, request: GenerationRequest) -> GenerationResult:
    """Generate one image under ``request.strategy``; the strategy is restored afterwards, whatever happens."""
    import npu_port

    check_request(loaded, request)
    pipe = loaded.pipe
    _set_vae_switches(pipe.vae, request)  # both ways: the pipeline is reused across requests (the demo)
    handle = npu_port.set_attention_strategy(request.strategy, target=pipe)
    try:
        devices.synchronize(loaded.device)
        if loaded.device.type != "cpu":
            devices.reset_peak_memory_stats(loaded.device)
        start = time.perf_counter()
        with _StepClock(pipe, loaded.device) as clock, torch.no_grad():
            generator = torch.Generator("cpu").manual_seed(request.seed)  # same start on every device
            output = pipe(**_call_arguments(loaded, request, generator))
        devices.synchronize(loaded.device)
        end = time.perf_counter()
        explanation = handle.explain()
        resolved = handle.name
    finally:
        handle.restore()
    ends = clock.ends
    if not ends:
        raise InferenceError(f"{type(pipe).__name__} ran no scheduler step; cannot time it")
    image = np.asarray(output.images[0], dtype=np.float32)
    return GenerationResult(
        image=image,
        strategy_requested=request.strategy,
        strategy_resolved=resolved,
        strategy_explanation=explanation,
        first_step_s=ends[0] - start,
        step_s=[later - earlier for earlier, later in zip(ends, ends[1:])],
        total_s=end - start,
        peak_memory=_peak_memory(loaded.device),
        details={"decode_s": end - ends[-1], "image_size": list(image.shape[:2])},
    )


def to_pil(image: np.ndarray):
    """An (H, W, 3) float image in [0, 1] as a PIL image."""
    from PIL import Image

    return Image.fromarray((np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8))
