"""One thing the doctor found: a stable id for programs, one line for people, and what to do about it.

A finding is data, like :class:`~npu_port.reasons.Reason`: the text report, the JSON report and the exit code are all
computed from the same list, so what a script sees (``--json``) is exactly what a person reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional

#: From harmless to blocking; the exit code is decided by the worst one present.
STATUSES = ("ok", "info", "warn", "error")

EXIT_CLEAN = 0  # only ok / info
EXIT_WARNINGS = 1  # something works worse than it could
EXIT_ERRORS = 2  # something is broken

VERDICTS = {EXIT_CLEAN: "ok", EXIT_WARNINGS: "warnings", EXIT_ERRORS: "errors"}


@dataclass(frozen=True)
class Finding:
    """The outcome of one check.

    ``check`` is a stable id ("torch-npu-import") that scripts and tests can match on; ``summary`` and ``fix`` are
    single lines, because a diagnosis that needs a paragraph is not yet understood; ``details`` keeps the raw facts
    (versions, paths, the first line of the real error) for the JSON report. ``code`` is the stable code of the
    :class:`~npu_port.reasons.Reason` behind the summary, where one is (a kernel that cannot run: ``package-missing``,
    ``no-device``...; a device that is not usable), so a script can act on the cause without parsing the text.
    """

    check: str
    title: str
    status: str
    summary: str
    fix: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)
    code: Optional[str] = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        for name in ("summary", "fix"):
            text = getattr(self, name)
            if text is not None and "\n" in text:
                raise ValueError(f"a finding's {name} is one line, got {text!r}")

    def as_dict(self) -> Dict[str, Any]:
        return {
            "check": self.check,
            "title": self.title,
            "status": self.status,
            "summary": self.summary,
            "code": self.code,
            "fix": self.fix,
            "details": dict(self.details),
        }


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when everything is ok or informational, 1 when anything warns, 2 when anything is an error."""
    statuses = {finding.status for finding in findings}
    if "error" in statuses:
        return EXIT_ERRORS
    if "warn" in statuses:
        return EXIT_WARNINGS
    return EXIT_CLEAN


def check_id(check: Callable[..., Any]) -> str:
    """The id a check function's findings share by default: ``check_torch_npu`` -> ``"torch-npu"``."""
    name = getattr(check, "__name__", type(check).__name__)
    if name.startswith("check_"):
        name = name[len("check_") :]
    return name.replace("_", "-")
