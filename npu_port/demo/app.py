"""The demo's UI and the pure helpers behind it.

The helpers (the strategy list, turning form values into a checked :class:`~npu_port.infer.GenerationRequest`,
formatting timings and comparisons) import no gradio, so tests call them without a browser. :func:`build_demo`
imports gradio and wires them to components. Out-of-range input never reaches the model: the request is checked
first against the model's limits (:class:`~npu_port.infer.limits.ModelLimits`, the same ones ``npu-port infer``
uses, lowered by ``--max-side`` / ``--max-steps``), and the message appears under the image. Cost is bounded too:
each request runs under a time limit (``--request-timeout``) and stops at the next denoising step past it, freeing
the single queue slot; the server refuses uploads over a few bytes (the demo takes no files).
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import InferenceError, NpuPortError
from ..infer.deadline import RequestTimeout
from ..infer.limits import ModelLimits
from ..infer.run import GenerationRequest

#: What a comparison starts with (those of them that can run here).
DEFAULT_COMPARE = ("vanilla", "sdpa", "auto")
#: The exact math kernel: the reference of a comparison whenever it is picked, so differences are measured from it.
REFERENCE = "vanilla"
MAX_PROMPT_CHARS = 2000
MAX_GUIDANCE = 30.0
#: Seconds one request (a Generate, or a whole Compare) may run before it is stopped (``--request-timeout``).
DEFAULT_REQUEST_TIMEOUT = 300.0
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


# --------------------------------------------------------------------------------------------- strategy list


@dataclass
class StrategyChoices:
    """What the strategy pickers offer: ``auto`` first, then every strategy and profile that can run here.

    Those that cannot run here are left out of the pickers (choosing one could only fail) and listed in
    ``unavailable`` with their first reason, which the page shows under the dropdown.
    """

    names: List[str]
    unavailable: Dict[str, str] = field(default_factory=dict)

    def compare_default(self) -> List[str]:
        return [name for name in DEFAULT_COMPARE if name in self.names]


def _first_reason(entry: Dict[str, Any]) -> str:
    for kernel, reasons in entry.get("reasons", {}).items():
        if reasons:
            return f"{kernel}: {reasons[0]}"
    return "no kernel of it can run here"


def strategy_choices(entries: Optional[Sequence[Dict[str, Any]]] = None) -> StrategyChoices:
    """Split the registry into what can run here and what cannot, using ``npu-port strategies``' own rows.

    ``entries``: rows as :func:`npu_port.strategy.registry.strategy_entry` makes them (default: every registered
    strategy and profile, checked on this machine).
    """
    if entries is None:
        from ..strategy.registry import list_strategies, strategy_entry

        entries = [strategy_entry(name) for name in list_strategies()]
    available = [entry["name"] for entry in entries if entry["available"]]
    names = [name for name in available if name == "auto"] + [name for name in available if name != "auto"]
    unavailable = {entry["name"]: _first_reason(entry) for entry in entries if not entry["available"]}
    return StrategyChoices(names, unavailable)


def check_strategy(name: str, choices: StrategyChoices) -> str:
    """``name`` if the demo offers it, else why not (unknown, or cannot run here)."""
    if name in choices.names:
        return name
    if name in choices.unavailable:
        raise InferenceError(
            f"strategy {name!r} cannot run here ({choices.unavailable[name]}); choose one of: "
            + ", ".join(choices.names)
        )
    raise InferenceError(f"unknown strategy {name!r}; choose one of: {', '.join(choices.names)}")


def compare_order(selected: Optional[Sequence[str]], choices: StrategyChoices) -> List[str]:
    """The picked strategies in the order they run: vanilla (the exact reference) first when picked, then the rest
    in the pickers' order. At least two are needed."""
    selected = list(selected or [])
    for name in selected:
        check_strategy(name, choices)
    picked = [name for name in choices.names if name in selected]
    if len(picked) < 2:
        got = f"{len(picked)}: {', '.join(picked)}" if picked else "none"
        raise InferenceError(f"pick at least two strategies to compare (got {got})")
    if REFERENCE in picked:
        picked.remove(REFERENCE)
        picked.insert(0, REFERENCE)
    return picked


# --------------------------------------------------------------------------------------------- requests


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
    """The side the pipeline makes when no size is given (the DiT's fixed one; else its sample size)."""
    if loaded.native_size is not None:
        return int(loaded.native_size)
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


# --------------------------------------------------------------------------------------------- formatting


_MARKDOWN_SPECIAL = set("\\`*_[]<>|#")


def markdown_escape(text: str) -> str:
    return "".join("\\" + char if char in _MARKDOWN_SPECIAL else char for char in text)


def device_line(loaded: Any) -> str:
    """``cpu: AMD EPYC 7B13 (2 threads), float32``"""
    from ..device import device_name

    return f"{device_name(loaded.device)}, {str(loaded.dtype).replace('torch.', '')}"


def header_markdown(loaded: Any, limits: ModelLimits, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> str:
    if limits.native_size is not None:
        size = f"{limits.native_size}×{limits.native_size} images only"
    else:
        size = f"sides up to {limits.max_side}"
    return (
        "## npu-port demo\n"
        f"**Device:** {markdown_escape(device_line(loaded))} · **model:** `{loaded.model}` ({loaded.kind}; {size}; "
        f"up to {limits.max_steps} steps) · one request runs at a time, others wait in the queue · a request "
        f"stops after {request_timeout:g} s"
    )


def random_weights_note(loaded: Any) -> Optional[str]:
    if not loaded.random_weights:
        return None
    return (
        f"⚠ **Random weights:** `{loaded.model}` is built with random weights, so its images are noise-like by "
        "design. Use it to check the timings and that every strategy makes the same image; start the demo with "
        "`--model DIR_OR_HUB_ID` for real pictures."
    )


def unavailable_markdown(choices: StrategyChoices) -> str:
    if not choices.unavailable:
        return ""
    items = "\n".join(f"- `{name}`: {markdown_escape(reason)}" for name, reason in choices.unavailable.items())
    intro = "These cannot run on this machine, so the pickers leave them out (`npu-port strategies` says more):"
    return f"{intro}\n\n{items}"


def _seconds(value: float) -> str:
    return f"{value:.3f} s"


def _mib(peak: Dict[str, Any]) -> str:
    return f"{peak['bytes'] / 2**20:.0f} MiB ({peak['what']})"


def format_result(result: Any) -> str:
    """The timing report shown beside the image."""
    steady = result.median_step_s
    steady_text = f"{steady * 1e3:.1f} ms" if steady is not None else "one step only"
    height, width = result.image.shape[:2]
    lines = [
        f"**Strategy:** `{result.strategy_requested}` → resolved **`{result.strategy_resolved}`**",
        f"- first step: {_seconds(result.first_step_s)} (with set-up)",
        f"- median step: {steady_text} (of the steps after the first; {len(result.step_s) + 1} steps in all)",
        f"- total: {_seconds(result.total_s)}",
        f"- peak memory: {markdown_escape(_mib(result.peak_memory))}",
        f"- image: {width}×{height}",
    ]
    return "\n".join(lines)


def error_markdown(exc: BaseException, *, refused: bool = True) -> str:
    """An error as the page shows it: the message whole (its first line in bold), nothing run when ``refused``;
    a request stopped by its time limit is "Stopped"."""
    text = str(exc).strip() or type(exc).__name__
    first, _, rest = text.partition("\n")
    if isinstance(exc, RequestTimeout):
        head = "Stopped"
    else:
        head = "Not run" if refused else f"Failed ({type(exc).__name__})"
    out = f"✘ **{head}:** {markdown_escape(first)}"
    if rest.strip():
        out += "\n\n```\n" + rest.strip("\n") + "\n```"
    return out


COMPARE_HEADERS = ("strategy", "resolved", "total", "median step", "max |diff|", "PSNR")


def comparison_rows(comparison: Any) -> List[List[str]]:
    """One row of text per strategy, in run order: the table under the gallery."""
    rows = []
    for name, result in comparison.results.items():
        steady = result.median_step_s
        psnr = comparison.psnr_db[name]
        diff = comparison.max_abs_diff[name]
        rows.append(
            [
                name,
                result.strategy_resolved,
                _seconds(result.total_s),
                f"{steady * 1e3:.1f} ms" if steady is not None else "-",
                "not finite" if not result.finite else (f"{diff:.2e}" if math.isfinite(diff) else "-"),
                "inf" if math.isinf(psnr) else ("-" if math.isnan(psnr) else f"{psnr:.1f} dB"),
            ]
        )
    return rows


def verdict(comparison: Any) -> str:
    """The comparison's verdict line ("all within ..." or "DIVERGED ..."), with a mark."""
    return ("✘ " if comparison.diverged else "✔ ") + comparison.verdict()


def not_finite_markdown(result: Any) -> str:
    """What Generate shows instead of an image with NaN or inf in it (saved, it would look like a black picture)."""
    return (
        f"✘ **Failed:** the image under strategy `{markdown_escape(result.strategy_requested)}` (resolved "
        f"`{markdown_escape(result.strategy_resolved)}`) is not finite: {result.non_finite} of {result.image.size} "
        "values are NaN or inf"
    )


def format_comparison(comparison: Any) -> str:
    header = "| " + " | ".join(markdown_escape(h) for h in COMPARE_HEADERS) + " |"
    rule = "|" + "---|" * len(COMPARE_HEADERS)
    body = ["| " + " | ".join(markdown_escape(cell) for cell in row) + " |" for row in comparison_rows(comparison)]
    return "\n".join(
        [
            f"**{verdict(comparison)}**",
            "",
            f"Differences are measured on the decoded image (0..1) against `{comparison.reference}`, "
            f"the first; tolerance {comparison.tolerance:g} for this dtype.",
            "",
            header,
            rule,
            *body,
        ]
    )


def gallery_items(comparison: Any) -> List[Tuple[Any, str]]:
    """(image, caption) per strategy, in run order."""
    from ..infer.run import to_pil

    items = []
    for name, result in comparison.results.items():
        if not result.finite:  # left out: the table and the verdict say why
            continue
        caption = (
            f"{name} → {result.strategy_resolved} · {result.total_s:.2f} s · "
            f"max|diff| {comparison.max_abs_diff[name]:.1e}"
        )
        items.append((to_pil(result.image), caption))
    return items


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
