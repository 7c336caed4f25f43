"""The demo's UI: :func:`build_demo` imports gradio and wires the pure helpers to components.

The helpers import no gradio, so tests call them without a browser: the strategy list (:mod:`.choices`: what
cannot run here is left out of the pickers and listed right under them with the reason, since gradio cannot grey out
one choice), turning form values into a checked :class:`~npu_port.infer.GenerationRequest` (:mod:`.form`), what the
page shows (:mod:`.formatting`) and the result image scaled up for display with its true size (:mod:`.display`; the
download is the true image). Out-of-range input never reaches the model: the request is checked
first against the model's limits (:class:`~npu_port.infer.limits.ModelLimits`, the same ones ``npu-port infer``
uses, lowered by ``--max-side`` / ``--max-steps``), and the message appears under the image; a call no widget could
make (:mod:`.payload`) is refused with one ``gr.Error`` line. Cost is bounded too: the queue is bounded, and so is
what one client holds in it (:mod:`.admission`, checked as a request joins); each request runs under a time limit
(``--request-timeout``) and stops at the next denoising step past it — or once its client has left
(:mod:`.watch`) — freeing the single queue slot; the server refuses uploads over a few bytes (the demo takes no files).
"""

from __future__ import annotations

import inspect
import shutil
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import NpuPortError
from ..infer.deadline import RequestTimeout
from ..infer.run import GenerationRequest
from ..upstream.gradio import QueueView
from .admission import Admission, QueueLimits
from .choices import REFERENCE, StrategyChoices, check_strategy, compare_order, strategy_choices
from .display import for_display
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
from .payload import CHOICE, CHOICES, NUMBER, RANGE, TEXT, Field, MalformedCall, check_call
from .watch import ClientLeft, WatchedDeadline

#: The name the demo's lines on the server's console start with (the script's name).
PROG = "gradio_demo_npu"

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
    queue_limits: Optional[QueueLimits] = None,
) -> Any:
    """The demo for one loaded pipeline, as a queued ``gr.Blocks`` (not launched: the caller does that).

    ``max_side`` / ``max_steps`` lower the model's limits (:func:`demo_limits`; None: the model's own);
    ``strategy`` is the dropdown's initial choice; ``request_timeout`` stops a request that runs longer (seconds,
    counted from when it starts running, not while it waits in the queue); ``queue_limits`` bounds the queue and
    what one client holds in it (:func:`queue_demo`; None: the defaults).
    """
    gr = require_gradio()
    from ..infer import compare_strategies, generate
    from ..infer.deadline import check_timeout
    from ..infer.run import to_pil

    limits = demo_limits(loaded, max_side=max_side, max_steps=max_steps)
    check_timeout(request_timeout)
    queue_limits = queue_limits or QueueLimits()
    factor = limits.factor
    choices = choices or strategy_choices()
    strategy = check_strategy(strategy, choices)
    files = ResultFiles()
    lock = threading.Lock()  # the queue already serialises; this keeps a demo launched without one safe too
    text_to_image = loaded.kind == "text-to-image"
    png = {"format": "png"} if _accepts(gr.Image, "format") else {}
    gallery_png = {"format": "png"} if _accepts(gr.Gallery, "format") else {}

    with gr.Blocks(title="npu-port demo", analytics_enabled=False) as demo:
        gr.Markdown(
            header_markdown(loaded, limits, request_timeout=request_timeout, queue_limits=queue_limits),
            elem_id="header",
        )
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
                if choices.unavailable:  # right under the picker, open: what cannot run here, and why
                    gr.Markdown(unavailable_markdown(choices), elem_id="unavailable")
                generate_button = gr.Button("Generate", variant="primary", elem_id="generate")
            with gr.Column(scale=1):
                # shown scaled up (nearest, crisp pixels: .display); the download below is the true image
                image = gr.Image(label="Image", interactive=False, elem_id="image", **png, **_no_download(gr))
                size_note = gr.Markdown(elem_id="image-size")
                download = gr.File(label="Download (true size)", interactive=False, elem_id="download")
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
        kinds = {
            "prompt": Field("prompt", TEXT),
            "negative_prompt": Field("negative_prompt", TEXT),
            "class_label": Field("class_label", NUMBER),
            "steps": Field("steps", RANGE, 1, limits.max_steps),
            "seed": Field("seed", NUMBER),
            "height": Field("height", NUMBER),
            "width": Field("width", NUMBER),
            "guidance_scale": Field("guidance_scale", RANGE, 0, MAX_GUIDANCE),
            "strategy": Field("strategy", CHOICE),
        }
        endpoints = {"generate": [kinds[name] for name in names]}
        endpoints["compare"] = [*endpoints["generate"], Field("strategies", CHOICES)]
        quiet_errors = _accepts(gr.Error, "print_exception")

        def refuse(exc: MalformedCall, page: Tuple[Any, ...]) -> Tuple[Any, ...]:
            """A call no widget could make: one gr.Error line, without a traceback in the server's log. A gradio
            without ``gr.Error(print_exception=)`` (5.0 to 5.8) logs one for every gr.Error, so there the message goes
            where the page shows a refusal instead (the same line, as the endpoint's result)."""
            if quiet_errors:
                raise gr.Error(str(exc), print_exception=False)
            return page

        def deadline(request: Any) -> WatchedDeadline:
            session = getattr(request, "session_hash", None)
            return WatchedDeadline(request_timeout, left=lambda: watching and view.left(session))

        def split(args: Tuple[Any, ...]) -> Tuple[List[Any], Any]:
            """The form's values and the gr.Request gradio appends (none when a test calls the handler itself)."""
            if args and isinstance(args[-1], gr.Request):
                return list(args[:-1]), args[-1]
            return list(args), None

        def on_generate(*args: Any) -> Tuple[Any, ...]:
            """(image shown, its size label, file to download, timings, explanation)."""
            values, client = split(args)
            try:
                check_call("generate", endpoints["generate"], values, choices)
                request = make_request(loaded, **dict(zip(names, values)), **bounds)
            except MalformedCall as exc:
                return refuse(exc, (None, "", None, error_markdown(exc), ""))
            except NpuPortError as exc:
                return None, "", None, error_markdown(exc), ""
            try:
                with lock:
                    result = generate(loaded, request, deadline=deadline(client))
            except ClientLeft as exc:
                print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
                return None, "", None, error_markdown(exc), ""
            except RequestTimeout as exc:
                return None, "", None, error_markdown(exc), ""
            except Exception as exc:  # shown in the page; the traceback goes to the server's log
                traceback.print_exc(file=sys.stderr)
                return None, "", None, error_markdown(exc, refused=False), ""
            if not result.finite:
                return None, "", None, not_finite_markdown(result), result.strategy_explanation
            true_image = to_pil(result.image)
            shown, label = for_display(true_image)
            return shown, label, files.save(true_image, request), format_result(result), result.strategy_explanation

        def on_compare(*args: Any) -> Tuple[List[Any], str]:
            values, client = split(args)
            try:
                check_call("compare", endpoints["compare"], values, choices)
                order = compare_order(values[-1], choices)
                request = make_request(loaded, **dict(zip(names, values[:-1])), **bounds)
            except MalformedCall as exc:
                return refuse(exc, ([], error_markdown(exc)))
            except NpuPortError as exc:
                return [], error_markdown(exc)
            try:
                with lock:
                    comparison = compare_strategies(loaded, request, order, deadline=deadline(client))
            except ClientLeft as exc:
                print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
                return [], error_markdown(exc)
            except RequestTimeout as exc:
                return [], error_markdown(exc)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                return [], error_markdown(exc, refused=False)
            return gallery_items(comparison), format_comparison(comparison)

        _takes_request(on_generate, [field.name for field in endpoints["generate"]], gr)
        _takes_request(on_compare, [field.name for field in endpoints["compare"]], gr)
        inputs = [fields[name] for name in names]
        # raw values (preprocess=False): payload.check_call checks them, so a malformed call never reaches gradio's
        # preprocessing, which fails on it with a traceback
        serial = {"concurrency_limit": 1, "concurrency_id": CONCURRENCY_ID, "preprocess": False}
        generate_button.click(
            on_generate, inputs, [image, size_note, download, info, explanation], api_name="generate", **serial
        )
        compare_button.click(on_compare, [*inputs, picked], [gallery, compare_info], api_name="compare", **serial)
    view = QueueView(demo)
    watching = queue_demo(demo, queue_limits, endpoints, view)
    return demo


def _no_download(gr: Any) -> Dict[str, Any]:
    """The argument that hides gr.Image's own download button (it would save the scaled-up display), where this gradio
    has one: ``buttons`` (gradio 6) or ``show_download_button`` (4 and 5)."""
    if _accepts(gr.Image, "buttons"):
        return {"buttons": ["fullscreen"]}
    if _accepts(gr.Image, "show_download_button"):
        return {"show_download_button": False}
    return {}


class ResultFiles:
    """The true-size PNG of the latest result, for the page's download (named after its size and seed): a folder of
    its own per result under one temporary folder per demo, the previous one removed when the next is written
    (gradio copies what it serves into its own cache first)."""

    def __init__(self) -> None:
        self.folder: Optional[Path] = None
        self.latest: Optional[Path] = None

    def save(self, image: Any, request: GenerationRequest) -> str:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="npu-port-demo-"))
        if self.latest is not None:
            shutil.rmtree(self.latest, ignore_errors=True)
        self.latest = Path(tempfile.mkdtemp(dir=self.folder))
        path = self.latest / f"npu-port-{image.width}x{image.height}-seed{request.seed}.png"
        image.save(path, format="PNG")
        return str(path)


def _takes_request(handler: Any, names: List[str], gr: Any) -> None:
    """Give ``handler(*args)`` a signature naming each input and then a ``gr.Request`` parameter: gradio passes the
    request (and with it the client's session) to the parameter annotated so, and names the API's parameters after
    the others."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter(name, kind) for name in names]
    parameters.append(inspect.Parameter("request", kind, annotation=gr.Request))
    handler.__signature__ = inspect.Signature(parameters)
    handler.__annotations__ = {"request": gr.Request}


def queue_demo(demo: Any, limits: QueueLimits, endpoints: Dict[str, List[Field]], view: QueueView) -> bool:
    """Queue ``demo`` within ``limits``; True when a request whose client has left can be told (and stopped).

    Gradio's own mechanisms where it has them: one slot for the model (``default_concurrency_limit=1`` and the
    events' shared ``concurrency_id``), at most ``limits.max_queue`` waiting (``max_size``: one more is refused with
    gradio's "queue is full"), and no route around the queue (``api_open=False``: gradio otherwise runs
    ``POST /run/<api_name>`` at once, beside the queue). What gradio lacks — at most ``limits.per_client`` per client,
    and a call's shape checked before it waits — is checked at the door (:mod:`.admission`,
    :mod:`npu_port.upstream.gradio`).
    """
    demo.queue(max_size=limits.max_queue, default_concurrency_limit=1, api_open=False)
    missing = view.missing()
    if missing:
        from .._optional import installed_version

        print(
            f"{PROG}: warning: gradio {installed_version('gradio')}'s queue has no {', '.join(missing)}: running "
            "without the per-client limit (--per-client) and without stopping a request whose client has left",
            file=sys.stderr,
            flush=True,
        )
        return False
    view.hold_joins(Admission(limits, endpoints, view.jobs).check)
    return True
