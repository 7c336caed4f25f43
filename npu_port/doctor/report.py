"""The doctor's two outputs: text for a person, JSON for a script; both built from the same findings.

The text is plain ASCII apart from what the checks quote (paths, error messages), so it survives any terminal
encoding and pastes cleanly into an issue.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .._version import __version__
from .pairing import rows_as_json
from .run import DoctorResult

_MARKERS = {"ok": "[ok]", "info": "[info]", "warn": "[warn]", "error": "[error]"}
_MARKER_WIDTH = max(len(marker) for marker in _MARKERS.values()) + 1
_HEADLINES = {
    "ok": "no problems found",
    "warnings": "works, with warnings",
    "errors": "problems found",
}


def _counts(result: DoctorResult) -> str:
    statuses = [finding.status for finding in result.findings]
    parts = [f"{statuses.count(status)} {status}" for status in ("error", "warn") if statuses.count(status)]
    return f" ({', '.join(parts)})" if parts else ""


def render_text(result: DoctorResult) -> str:
    """A header with the verdict and exit code, then each group: ``[status] summary`` and an indented ``fix:``."""
    lines: List[str] = [
        f"npu-port {__version__} doctor: {_HEADLINES[result.verdict]}{_counts(result)}; exit code {result.exit_code}"
    ]
    indent = " " * (2 + _MARKER_WIDTH)
    for title, findings in result.groups:
        lines += ["", title]
        for finding in findings:
            lines.append(f"  {_MARKERS[finding.status]:<{_MARKER_WIDTH}}{finding.summary}")
            if finding.fix:
                lines.append(f"{indent}fix: {finding.fix}")
    return "\n".join(lines)


def as_json(result: DoctorResult) -> Dict[str, Any]:
    """``{"npu_port_version", "exit_code", "verdict", "findings": [...], "torch_npu_pairings": [...]}``; each
    finding also names its group, and the pairing table the checks judged by travels with them."""
    return {
        "npu_port_version": __version__,
        "exit_code": result.exit_code,
        "verdict": result.verdict,
        "findings": [
            {**finding.as_dict(), "group": title} for title, findings in result.groups for finding in findings
        ],
        "torch_npu_pairings": rows_as_json(),
    }
