"""What the demo shows: the header, a result's timings and peak memory, a comparison's table and verdict, and errors
as one readable line — all as Markdown, with user text escaped."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from ..infer.deadline import RequestTimeout
from ..infer.limits import ModelLimits
from .admission import QueueLimits
from .choices import StrategyChoices
from .form import DEFAULT_REQUEST_TIMEOUT

_MARKDOWN_SPECIAL = set("\\`*_[]<>|#")


def markdown_escape(text: str) -> str:
    return "".join("\\" + char if char in _MARKDOWN_SPECIAL else char for char in text)


def device_line(loaded: Any) -> str:
    """``cpu: AMD EPYC 7B13 (2 threads), float32``"""
    from ..device import device_name

    return f"{device_name(loaded.device)}, {str(loaded.dtype).replace('torch.', '')}"


def header_markdown(
    loaded: Any,
    limits: ModelLimits,
    *,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    queue_limits: Optional[QueueLimits] = None,
) -> str:
    if limits.native_size is not None:
        size = f"{limits.native_size}×{limits.native_size} images only"
    else:
        size = f"sides up to {limits.max_side}"
    queue = queue_limits or QueueLimits()
    return (
        "## npu-port demo\n"
        f"**Device:** {markdown_escape(device_line(loaded))} · **model:** `{loaded.model}` ({loaded.kind}; {size}; "
        f"up to {limits.max_steps} steps) · one request runs at a time, up to {queue.max_queue} wait in the queue, "
        f"{queue.per_client} at most per visitor · a request stops after {request_timeout:g} s"
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
    """The note right under the strategy picker: each strategy or profile the pickers leave out, greyed-out style
    (⊘), with why it cannot run here — gradio's pickers cannot show a single choice disabled."""
    if not choices.unavailable:
        return ""
    items = "\n".join(f"- ⊘ `{name}` — {markdown_escape(reason)}" for name, reason in choices.unavailable.items())
    intro = "**Not available on this machine** (disabled; `npu-port strategies` says more):"
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
