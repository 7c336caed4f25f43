"""The demo's form values turned into a checked :class:`~npu_port.infer.GenerationRequest`: out-of-range input never
reaches the model — it is checked first against the model's limits (:class:`~npu_port.infer.limits.ModelLimits`, the
same ones ``npu-port infer`` uses, lowered by ``--max-side`` / ``--max-steps``)."""

from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import InferenceError
from ..infer.limits import ModelLimits
from ..infer.run import GenerationRequest
from .choices import StrategyChoices, check_strategy

MAX_PROMPT_CHARS = 2000
MAX_GUIDANCE = 30.0
#: Seconds one request (a Generate, or a whole Compare) may run before it is stopped (``--request-timeout``).
DEFAULT_REQUEST_TIMEOUT = 300.0


def whole_number(label: str, value: Any, *, optional: bool = False) -> Optional[int]:
    """A form value as an int, or a message naming the field (an empty field is None when ``optional``)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        if optional:
            return None
        raise InferenceError(f"{label} is empty; give a whole number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InferenceError(f"{label} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise InferenceError(f"{label} must be a whole number, got {value!r}")
    return int(number)


def default_size(loaded: Any) -> int:
    """The side the pipeline makes when no size is given (the DiT's fixed one; a built-in model's own default, e.g.
    tiny-flux's 128; else its sample size)."""
    if loaded.native_size is not None:
        return int(loaded.native_size)
    if "height" in loaded.limits.call_defaults:
        return int(loaded.limits.call_defaults["height"])
    pipe = loaded.pipe
    for component in ("unet", "transformer"):
        model = getattr(pipe, component, None)
        sample = getattr(getattr(model, "config", None), "sample_size", None)
        if sample is not None:
            sample = sample[0] if isinstance(sample, (list, tuple)) else sample
            return int(sample) * loaded.vae_scale_factor
    return 512


def demo_limits(loaded: Any, *, max_side: Optional[int] = None, max_steps: Optional[int] = None) -> ModelLimits:
    """The model's limits (``npu_port.infer.limits``), lowered by the demo's ``--max-side`` / ``--max-steps``:
    those can only lower them."""
    return loaded.limits.lowered(max_side=max_side, max_steps=max_steps)


def make_request(
    loaded: Any,
    *,
    strategy: str,
    choices: StrategyChoices,
    steps: Any,
    seed: Any,
    prompt: Optional[str] = None,
    negative_prompt: Optional[str] = None,
    class_label: Any = None,
    height: Any = None,
    width: Any = None,
    guidance_scale: Any = 4.0,
    max_side: Optional[int] = None,
    max_steps: Optional[int] = None,
) -> GenerationRequest:
    """Form values to a request the model may run, or :class:`InferenceError` with the message to show."""
    strategy = check_strategy(strategy, choices)
    defaults = GenerationRequest()
    request = GenerationRequest(
        steps=whole_number("steps", steps),
        seed=whole_number("seed", seed),
        strategy=strategy,
    )
    try:
        request.guidance_scale = float(defaults.guidance_scale if guidance_scale is None else guidance_scale)
    except (TypeError, ValueError):
        raise InferenceError(f"guidance scale must be a number, got {guidance_scale!r}") from None
    if not 0.0 <= request.guidance_scale <= MAX_GUIDANCE:
        raise InferenceError(f"guidance scale must be between 0 and {MAX_GUIDANCE:g}, got {request.guidance_scale:g}")
    if loaded.kind == "class-conditional":
        request.class_label = whole_number("class", class_label)
    else:
        request.prompt = prompt or ""
        request.negative_prompt = negative_prompt or None
        for name, text in (("prompt", request.prompt), ("negative prompt", request.negative_prompt or "")):
            if len(text) > MAX_PROMPT_CHARS:
                raise InferenceError(f"{name} is {len(text)} characters long; at most {MAX_PROMPT_CHARS}")
        request.height = whole_number("height", height, optional=True)
        request.width = whole_number("width", width, optional=True)
    demo_limits(loaded, max_side=max_side, max_steps=max_steps).check(request)  # the seed's range too
    return request
