"""The three written forms of a bench run: a table to read, CSV to load into a spreadsheet, JSON to keep.

The CSV has one row per cell with fixed :data:`COLUMNS` (times in milliseconds, memory in MiB) so files from several
machines concatenate; the JSON is the whole :class:`~.results.BenchReport` in seconds and bytes, with the machine and
auto's per-candidate measurements. The table puts a refusal's reason where the time would be, and ends with the
fastest correct strategy per shape — the answer most readers want. A run stopped early says PARTIAL at the top and
bottom of the table, ``"partial": true`` in the JSON and ``partial_run`` in every CSV row. Files are written with
:mod:`npu_port.atomic`, so an interrupted write leaves the previous file as it was.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import atomic
from .results import OK, BenchReport, Cell

MiB = 1 << 20

COLUMNS = (
    "device",
    "dtype",
    "shape",
    "batch",
    "heads",
    "seq_q",
    "seq_kv",
    "head_dim",
    "causal",
    "strategy",
    "status",
    "kernel",
    "median_ms",
    "min_ms",
    "runs",
    "select_ms",
    "peak_mib",
    "tflops",
    "parity_max_abs_error",
    "parity_ok",
    "note",
    "partial_run",
)


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds * 1e3, 6)


def csv_row(cell: Cell, report: BenchReport) -> Dict[str, Any]:
    return {
        "device": report.settings["device"],
        "dtype": report.settings["dtype"],
        "shape": cell.shape,
        "batch": cell.batch,
        "heads": cell.heads,
        "seq_q": cell.seq_q,
        "seq_kv": cell.seq_kv,
        "head_dim": cell.head_dim,
        "causal": cell.causal,
        "strategy": cell.strategy,
        "status": cell.status,
        "kernel": cell.kernel,
        "median_ms": _ms(cell.median_s),
        "min_ms": _ms(cell.min_s),
        "runs": cell.runs,
        "select_ms": _ms(cell.select_s),
        "peak_mib": None if cell.peak_bytes is None else round(cell.peak_bytes / MiB, 3),
        "tflops": None if cell.tflops is None else round(cell.tflops, 6),
        "parity_max_abs_error": cell.parity_max_abs_error,
        "parity_ok": cell.parity_ok,
        "note": cell.note,
        "partial_run": report.partial,
    }


def write_csv(report: BenchReport, path: Path) -> None:
    """The cells as CSV, written atomically (a unique temporary file, then renamed into place)."""

    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            for cell in report.cells:
                writer.writerow({k: "" if v is None else v for k, v in csv_row(cell, report).items()})

    atomic.write_with(path, write)


def write_json(report: BenchReport, path: Path) -> None:
    """The whole report as JSON, written atomically; non-finite numbers become null (valid JSON)."""
    atomic.write_json(path, report.as_dict(), indent=2)


def fastest(report: BenchReport) -> Dict[str, Cell]:
    """Shape -> the fastest cell that ran and passed the parity check."""
    best: Dict[str, Cell] = {}
    for cell in report.cells:
        if cell.status == OK and cell.parity_ok and cell.median_s is not None:
            if cell.shape not in best or cell.median_s < best[cell.shape].median_s:
                best[cell.shape] = cell
    return best


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(report: BenchReport) -> str:
    m, s = report.machine, report.settings
    lines: List[str] = [partial_summary(report)] if report.partial else []
    lines.append(
        f"npu-port bench on {m['device_name']}: torch {m['torch']}, {s['dtype']}, "
        f"median of {s['repeats']} after {s['warmup']} warm-up, parity vs float64 on {s['parity_rows']} rows"
    )
    header = ("shape", "strategy", "kernel", "median ms", "TFLOP/s", "peak MiB", "max|err|", "note")
    rows: List[tuple] = []
    for c in report.cells:
        if c.status == OK:
            err = _fmt(c.parity_max_abs_error, ".1e") + ("" if c.parity_ok else " (!)")
            peak = _fmt(None if c.peak_bytes is None else c.peak_bytes / MiB, ".4g")
            rows.append(
                (
                    c.shape,
                    c.strategy,
                    c.kernel or "-",
                    _fmt(c.median_s * 1e3, ".3f"),
                    _fmt(c.tflops, ".3f"),
                    peak,
                    err,
                    c.note,
                )
            )
        else:
            rows.append((c.shape, c.strategy, c.kernel or "-", c.status, "-", "-", "-", c.note))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header) - 1)]
    numeric = {3, 4, 5, 6}
    for row in [header] + rows:
        cells = [str(v).rjust(widths[i]) if i in numeric else str(v).ljust(widths[i]) for i, v in enumerate(row[:-1])]
        lines.append("  ".join(cells + [str(row[-1])]).rstrip())
    best = fastest(report)
    if best:
        lines.append(
            "fastest correct strategy per shape: "
            + "; ".join(f"{shape}: {c.strategy} ({c.kernel}, {c.median_s * 1e3:.3f} ms)" for shape, c in best.items())
        )
    if any(c.status == OK and not c.parity_ok for c in report.cells):
        lines.append("(!) = error above the dtype's tolerance (the one auto uses): do not trust that strategy here")
    for name, why in report.skipped_shapes:
        lines.append(f"skipped shape {name}: {why}")
    for name, why in report.skipped_strategies:
        lines.append(f"skipped strategy {name}: {why}")
    if report.partial:
        lines.append(partial_summary(report))
    return "\n".join(lines)


def partial_summary(report: BenchReport) -> str:
    """The line that heads and ends the table of a run stopped early."""
    return (
        f"PARTIAL RESULTS: {report.stopped_because}; {report.measured_cells} of {report.planned_cells} "
        "measurements (strategy x shape) done"
    )
