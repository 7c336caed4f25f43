"""``bench.png``: time per shape per strategy at a glance, refusals marked where their bar would be.

Times span four orders of magnitude between a 256-token encoder layer and a 61440-token video, so the axis is
logarithmic. A strategy that was refused, unavailable or failed gets a labelled marker instead of a bar: a missing
bar would read as "not measured", when "cannot run this" is the finding. matplotlib is an optional dependency
(the ``bench`` extra), imported only here, and drawn through its object API with the Agg canvas, so no
display or global pyplot state is involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from .. import atomic
from . import BenchError
from .results import OK, BenchReport

MARKS = {"refused": "refused", "unavailable": "n/a", "failed": "failed", "interrupted": "interrupted"}


def require_matplotlib() -> None:
    """Fail before an hour of measuring, not after, when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        from .._optional import extra_hint

        raise BenchError(f"bench.png needs matplotlib: {extra_hint('bench')}, or use --no-plot ({exc})") from None


def write_png(report: BenchReport, path: Path) -> None:
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    shapes: List[str] = list(dict.fromkeys(c.shape for c in report.cells))
    strategies: List[str] = list(dict.fromkeys(c.strategy for c in report.cells))
    cells: Dict[tuple, object] = {(c.shape, c.strategy): c for c in report.cells}
    times = [c.median_s * 1e3 for c in report.cells if c.status == OK and c.median_s]
    floor = min(times) / 3 if times else 0.1

    fig = Figure(figsize=(max(6.0, 1.6 * len(shapes) * max(1, len(strategies)) / 3 + 2), 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(strategies))
    colours = [f"C{i % 10}" for i in range(len(strategies))]
    for j, strategy in enumerate(strategies):
        xs, heights, labels = [], [], []
        for i, shape in enumerate(shapes):
            cell = cells.get((shape, strategy))
            x = i - 0.4 + width * (j + 0.5)
            if cell is None:
                continue
            if cell.status == OK and cell.median_s:
                xs.append(x)
                heights.append(cell.median_s * 1e3)
                labels.append(cell.kernel or "")
            else:
                ax.plot([x], [floor], marker="x", color=colours[j], markersize=8)
                ax.annotate(
                    MARKS.get(cell.status, cell.status),
                    (x, floor),
                    xytext=(0, 6),
                    textcoords="offset points",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        bars = ax.bar(xs, heights, width=width, color=colours[j])
        for bar, label in zip(bars, labels):
            if label and label != strategy:
                ax.annotate(
                    label,
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 2),
                    textcoords="offset points",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
    ax.set_yscale("log")
    top = max(times) * 4 if times else 1.0
    ax.set_ylim(bottom=floor / 1.5, top=top)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, fontsize=8)
    ax.set_ylabel("median time per call (ms, log scale)")
    m, s = report.machine, report.settings
    title = f"attention strategies on {m['device_name']}\n{s['dtype']}, torch {m['torch']}; x = cannot run"
    if report.partial:
        title = f"PARTIAL: {report.measured_cells} of {report.planned_cells} measurements ({report.stopped_because})\n"
        title += f"{m['device_name']}, {s['dtype']}, torch {m['torch']}; x = not timed"
    ax.set_title(title, fontsize=9, **({"color": "firebrick"} if report.partial else {}))
    handles = [Patch(color=colour, label=strategy) for colour, strategy in zip(colours, strategies)]
    ax.legend(handles=handles, fontsize=7, ncol=min(4, max(1, len(strategies))))
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    atomic.write_with(path, fig.savefig)
