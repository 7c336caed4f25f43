"""The demo's UI: :func:`build_demo` imports gradio and wires the pure helpers to components.

The helpers import no gradio, so tests call them without a browser: the strategy list (:mod:`.choices`), turning
form values into a checked :class:`~npu_port.infer.GenerationRequest` (:mod:`.form`), and what the page shows
(:mod:`.formatting`). Out-of-range input never reaches the model: the request is checked
first against the model's limits (:class:`~npu_port.infer.limits.ModelLimits`, the same ones ``npu-port infer``
uses, lowered by ``--max-side`` / ``--max-steps``), and the message appears under the image. Cost is bounded too:
each request runs under a time limit (``--request-timeout``) and stops at the next denoising step past it, freeing
the single queue slot; the server refuses uploads over a few bytes (the demo takes no files).
"""

from __future__ import annotations

import inspect
import sys
import threading
import traceback
from typing import Any, Dict, List, Optional, Tuple

from ..errors import NpuPortError
from ..infer.deadline import RequestTimeout
from ..infer.run import GenerationRequest
from .choices import REFERENCE, StrategyChoices, check_strategy, compare_order, strategy_choices
from .form import DEFAULT_REQUEST_TIMEOUT, MAX_GUIDANCE, default_size, demo_limits, make_request
from .formatting import (
    error_markdown,
    format_comparison,
    format_result,
    gallery_items,
    header_markdown,
    not_finite_markdown,
    random_weights_note,
    unavailable_markdown,
)

#: Largest upload the server accepts (Gradio's ``max_file_size``): the demo has no file input, so any upload is
#: someone else's; a few bytes keep the endpoint from storing anything sizeable.
MAX_UPLOAD_BYTES = 1024
#: One slot for the model: Generate and Compare share it, so they never run at the same time on the one device.
CONCURRENCY_ID = "model"


class GradioMissingError(NpuPortError, ImportError):
    """gradio is not installed (or is installed but cannot be imported)."""


def require_gradio() -> Any:
    """The gradio module, or one clear line saying how to get it."""
    try:
        import gradio
    except ImportError as exc:
        from .._optional import extra_hint

        raise GradioMissingError(f"the demo needs gradio ({exc}): {extra_hint('demo')}") from None
    return gradio


# --------------------------------------------------------------------------------------------- the UI


def _accepts(component: Any, argument: str) -> bool:
    """Whether this gradio's component takes ``argument`` (the demo supports gradio 4.44 to 6)."""
    return argument in inspect.signature(component.__init__).parameters


def build_demo(
    loaded: Any,
    *,
    max_side: Optional[int] = None,
    max_steps: Optional[int] = None,
    strategy: str = "auto",
    choices: Optional[StrategyChoices] = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> Any:
    """The demo for one loaded pipeline, as a ``gr.Blocks`` (not queued or launched: the caller does both).

    ``max_side`` / ``max_steps`` lower the model's limits (:func:`demo_limits`; None: the model's own);
    ``strategy`` is the dropdown's initial choice; ``request_timeout`` stops a request that runs longer (seconds,
    counted from when it starts running, not while it waits in the queue).
    """
    gr = require_gradio()
    from ..infer import Deadline, compare_strategies, generate
    from ..infer.deadline import check_timeout
    from ..infer.run import to_pil

    limits = demo_limits(loaded, max_side=max_side, max_steps=max_steps)
    check_timeout(request_timeout)
    factor = limits.factor
    choices = choices or strategy_choices()
    strategy = check_strategy(strategy, choices)
    lock = threading.Lock()  # the queue already serialises; this keeps a demo launched without one safe too
    text_to_image = loaded.kind == "text-to-image"
    png = {"format": "png"} if _accepts(gr.Image, "format") else {}
    gallery_png = {"format": "png"} if _accepts(gr.Gallery, "format") else {}

    with gr.Blocks(title="npu-port demo", analytics_enabled=False) as demo:
        gr.Markdown(header_markdown(loaded, limits, request_timeout=request_timeout), elem_id="header")
        note = random_weights_note(loaded)
        if note:
            gr.Markdown(note, elem_id="random-weights")
        fields: Dict[str, Any] = {}
        with gr.Row():
            with gr.Column(scale=1):
                if text_to_image:
                    fields["prompt"] = gr.Textbox(
                        label="Prompt", value=GenerationRequest().prompt, lines=2, elem_id="prompt"
                    )
                    fields["negative_prompt"] = gr.Textbox(label="Negative prompt", value="", elem_id="negative")
                else:
                    classes = int(loaded.pipe.transformer.config.num_embeds_ada_norm or 0)
                    fields["class_label"] = gr.Number(
                        label="Class",
                        value=GenerationRequest().class_label,
                        precision=0,
                        elem_id="class-label",
                        info=f"class id, 0 to {classes - 1}" if classes else "class id",
                    )
                fields["steps"] = gr.Slider(
                    1, limits.max_steps, value=min(10, limits.max_steps), step=1, label="Steps", elem_id="steps"
                )
                fields["seed"] = gr.Number(label="Seed", value=0, precision=0, elem_id="seed")
                if text_to_image:
                    size = min(default_size(loaded), limits.max_side)
                    hint = f"a multiple of {factor}, {factor} to {limits.max_side}"
                    with gr.Row():
                        fields["height"] = gr.Number(
                            label="Height", value=size, precision=0, info=hint, elem_id="height"
                        )
                        fields["width"] = gr.Number(label="Width", value=size, precision=0, info=hint, elem_id="width")
                fields["guidance_scale"] = gr.Slider(
                    0,
                    MAX_GUIDANCE,
                    value=GenerationRequest().guidance_scale,
                    step=0.5,
                    label="Guidance scale",
                    elem_id="guidance",
                )
                fields["strategy"] = gr.Dropdown(
                    choices.names,
                    value=strategy,
                    label="Attention strategy",
                    elem_id="strategy",
                    info="auto measures the kernels that can run here and picks per attention shape",
                )
                if choices.unavailable:
                    with gr.Accordion(f"Not offered here: {', '.join(choices.unavailable)}", open=False):
                        gr.Markdown(unavailable_markdown(choices), elem_id="unavailable")
                generate_button = gr.Button("Generate", variant="primary", elem_id="generate")
            with gr.Column(scale=1):
                image = gr.Image(label="Image", interactive=False, height=384, elem_id="image", **png)
                info = gr.Markdown(elem_id="generate-info")
                with gr.Accordion("What the strategy decided", open=False):
                    explanation = gr.Textbox(show_label=False, lines=8, interactive=False, elem_id="explanation")
        gr.Markdown(
            "### Compare strategies\nThe same seed and settings under each picked strategy; "
            f"`{REFERENCE}` (the exact math kernel) is the reference when picked, else the first in the list."
        )
        with gr.Row():
            picked = gr.CheckboxGroup(
                choices.names,
                value=choices.compare_default(),
                label="Strategies",
                elem_id="compare-strategies",
                scale=3,
            )
            compare_button = gr.Button("Compare strategies", elem_id="compare", scale=1)
        gallery = gr.Gallery(label="Images", columns=4, elem_id="gallery", **gallery_png)
        compare_info = gr.Markdown(elem_id="compare-info")

        names = list(fields)
        bounds = {"choices": choices, "max_side": limits.max_side, "max_steps": limits.max_steps}

        def on_generate(*values: Any) -> Tuple[Any, str, str]:
            try:
                request = make_request(loaded, **dict(zip(names, values)), **bounds)
            except NpuPortError as exc:
                return None, error_markdown(exc), ""
            try:
                with lock:
                    result = generate(loaded, request, deadline=Deadline(request_timeout))
            except RequestTimeout as exc:
                return None, error_markdown(exc), ""
            except Exception as exc:  # shown in the page; the traceback goes to the server's log
                traceback.print_exc(file=sys.stderr)
                return None, error_markdown(exc, refused=False), ""
            if not result.finite:
                return None, not_finite_markdown(result), result.strategy_explanation
            return to_pil(result.image), format_result(result), result.strategy_explanation

        def on_compare(*values: Any) -> Tuple[List[Any], str]:
            try:
                order = compare_order(values[-1], choices)
                request = make_request(loaded, **dict(zip(names, values[:-1])), **bounds)
            except NpuPortError as exc:
                return [], error_markdown(exc)
            try:
                with lock:
                    comparison = compare_strategies(loaded, request, order, deadline=Deadline(request_timeout))
            except RequestTimeout as exc:
                return [], error_markdown(exc)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                return [], error_markdown(exc, refused=False)
            return gallery_items(comparison), format_comparison(comparison)

        inputs = [fields[name] for name in names]
        serial = {"concurrency_limit": 1, "concurrency_id": CONCURRENCY_ID}
        generate_button.click(on_generate, inputs, [image, info, explanation], api_name="generate", **serial)
        compare_button.click(on_compare, [*inputs, picked], [gallery, compare_info], api_name="compare", **serial)
    return demo
