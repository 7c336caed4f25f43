"""The comparison as a picture: error per module call, in execution order, one line per denoising step.

Read it left to right: where a step's line leaves the tolerance line is where that step goes wrong; a line that
starts high was handed the error by an earlier step. The y axis is logarithmic (errors span 1e-8 to 1); an error of 0
is drawn at the bottom, a NaN / inf / shape change at the top (``x``). The first divergence is circled and named.

``write_plot(report, "diff.png")`` writes a PNG; a path ending in ``.html`` writes one self-contained page (the PNG
embedded, then a table of the first divergent calls) that can be mailed or attached to an issue. matplotlib (the
``bench`` extra) is imported only here, through its object API (no pyplot state), and the file is written atomically.
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple, Union

from .. import atomic
from .compare import CallResult, DiffReport
from .text import call_line, origin_text, report_text

#: Divergent calls listed in the HTML page's table.
TABLE_ROWS = 50
_FLOOR = 1e-10
SUFFIXES = (".png", ".html", ".htm")


def require_matplotlib() -> None:
    """Say how to get matplotlib, before anything is compared or run."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        from .._optional import extra_hint

        raise ImportError(f"the diff plot needs matplotlib: {extra_hint('bench')} ({exc})") from None


def check_plot_path(path: Union[str, os.PathLike]) -> Path:
    """``path`` if it names a PNG or an HTML page (a path without a suffix is a PNG), else ValueError."""
    destination = Path(path)
    if destination.suffix.lower() not in SUFFIXES + ("",):
        raise ValueError(f"plot file {str(destination)!r}: give a .png or an .html path")
    return destination


def _series(report: DiffReport) -> Dict[int, List[Tuple[int, float, CallResult]]]:
    """Per step: (position within the step, error, call), in execution order."""
    steps: Dict[int, List[Tuple[int, float, CallResult]]] = {}
    for call in report.calls:
        worst = call.worst()
        error = worst.error if worst is not None else 0.0
        points = steps.setdefault(call.step, [])
        points.append((len(points), error, call))
    return steps


def _png(report: DiffReport) -> bytes:
    require_matplotlib()
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = _series(report)
    finite = [e for points in steps.values() for _, e, _ in points if math.isfinite(e) and e > 0]
    tolerances = Counter(w.tolerance for c in report.calls for w in [c.worst()] if w is not None)
    tolerance = tolerances.most_common(1)[0][0] if tolerances else None
    low = min(finite + ([tolerance] if tolerance else []), default=1e-6) / 10
    low = max(low, _FLOOR)
    high = max(finite + ([tolerance] if tolerance else []), default=1.0) * 10

    fig = Figure(figsize=(10, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for number, step in enumerate(sorted(steps)):
        points = steps[step]
        colour = f"C{number % 10}"
        xs = [x for x, _, _ in points]
        ys = [min(max(e, low), high) if math.isfinite(e) else high for _, e, _ in points]
        label = f"step {step}" if step >= 0 else "before the first step"
        ax.plot(xs, ys, color=colour, linewidth=1, label=label)
        bad = [(x, high) for x, e, _ in points if not math.isfinite(e)]
        if bad:
            ax.plot([x for x, _ in bad], [y for _, y in bad], "x", color=colour, markersize=7)
    if tolerance:
        ax.axhline(tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g}")
    first = report.first_divergence
    if first is not None:
        for x, error, call in steps[first.step]:
            if call is first:
                y = min(max(error, low), high) if math.isfinite(error) else high
                ax.plot([x], [y], "o", markersize=12, markerfacecolor="none", markeredgecolor="red")
                ax.annotate(f"{first.module} (step {first.step})", (x, y), xytext=(8, -14),
                            textcoords="offset points", color="red", fontsize=8)  # fmt: skip
    ax.set_yscale("log")
    ax.set_ylim(low / 2, high * 2)
    ax.set_xlabel("module call, in execution order within the step")
    ax.set_ylabel("error (relative to the tensor's scale)")
    title = "first divergence: " + (f"{first.module}, step {first.step}" if first else "none")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _html(report: DiffReport, png: bytes) -> str:
    rows = []
    for call in report.divergent[:TABLE_ROWS]:
        worst = call.worst()
        cells = [
            str(call.step),
            str(call.call),
            call.module,
            call.cls,
            worst.metric if worst else "",
            f"{worst.error:.3g}" if worst else "",
            f"{worst.tolerance:.3g}" if worst else "",
            origin_text(call),
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = ["step", "call", "module", "class", "metric", "error", "tolerance", "origin"]
    more = len(report.divergent) - TABLE_ROWS
    first = report.first_divergence
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html><head><meta charset="utf-8"><title>npu-port diff</title>',
            "<style>body{font-family:sans-serif}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style></head><body>",
            f"<h1>npu-port diff</h1><p>{html.escape(call_line(first) if first else 'no divergence')}</p>",
            f"<pre>{html.escape(report_text(report, top=0))}</pre>",
            f'<img alt="error per module call" src="data:image/png;base64,{base64.b64encode(png).decode()}">',
            f"<h2>divergent calls, in execution order ({len(report.divergent)})</h2>",
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>",
            *rows,
            "</table>",
            f"<p>and {more} more</p>" if more > 0 else "",
            "</body></html>",
        ]
    )


def write_plot(report: DiffReport, path: Union[str, os.PathLike]) -> Path:
    """Draw ``report`` into ``path``: a PNG, or an HTML page when it ends in ``.html`` (see the module docstring)."""
    destination = check_plot_path(path)
    png = _png(report)
    if destination.suffix.lower() in (".html", ".htm"):
        atomic.write_text(destination, _html(report, png))
    else:
        atomic.write_bytes(destination, png)
    return destination
