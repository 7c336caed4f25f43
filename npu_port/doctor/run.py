"""Run every check in order, never letting one of them crash the doctor.

The order is the order of dependence: Python and torch first (the in-process ``import torch`` is decided there),
then the Ascend stack, devices, attention, diffusers, the Ascend extensions (MindIE-SD, flash-attn-npu) and settings.
A check that raises is itself a finding (a warning that asks for a report) and the others still run: the doctor is
what people run when things are broken, so it must not be one more thing that breaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from . import (
    checks_ascend,
    checks_attention,
    checks_devices,
    checks_diffusers,
    checks_extensions,
    checks_python,
    checks_settings,
    checks_versions,
)
from .facts import Check, Facts
from .finding import VERDICTS, Finding, check_id, exit_code

#: (group title, checks) in the order they run and print.
CHECK_GROUPS: Tuple[Tuple[str, Tuple[Check, ...]], ...] = (
    ("Python and torch", (checks_python.check_python_version, checks_python.check_torch)),
    (
        "Ascend: torch_npu and CANN",
        (
            checks_ascend.check_torch_npu,
            checks_ascend.check_torch_npu_pairing,
            checks_ascend.check_torch_npu_cann,
            checks_ascend.check_backend_autoload,
            checks_ascend.check_cann,
        ),
    ),
    ("Devices", (checks_devices.check_devices,)),
    (
        "Attention",
        (
            checks_attention.check_npu_chip,
            checks_attention.check_sdpa_backends,
            checks_attention.check_attention_kernels,
        ),
    ),
    ("diffusers", (checks_diffusers.check_diffusers,)),
    ("Versions and integrations", (checks_versions.check_versions, checks_versions.check_integrations)),
    ("Ascend extensions", (checks_extensions.check_mindiesd, checks_extensions.check_flash_attn_npu)),
    ("Recommended Ascend settings", (checks_settings.check_npu_settings,)),
)


@dataclass(frozen=True)
class DoctorResult:
    """Findings grouped as printed, with the exit code and verdict they imply."""

    groups: Tuple[Tuple[str, Tuple[Finding, ...]], ...]

    @property
    def findings(self) -> List[Finding]:
        return [finding for _, findings in self.groups for finding in findings]

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)

    @property
    def verdict(self) -> str:
        return VERDICTS[self.exit_code]


def run_check(check: Check, facts: Facts) -> List[Finding]:
    """``check(facts)``, or one warning finding if it raises (or returns something that is not findings)."""
    try:
        findings = list(check(facts))
        if not all(isinstance(finding, Finding) for finding in findings):
            raise TypeError(f"{getattr(check, '__name__', check)!r} returned something other than findings")
        return findings
    except Exception as exc:  # noqa: BLE001 - a failing check is a finding, never a traceback
        name = check_id(check)
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        return [
            Finding(
                name,
                name.replace("-", " "),
                "warn",
                f"the {name} check failed: {message}",
                "please report this",
                {"exception": type(exc).__name__, "message": str(exc)},
            )
        ]


def run_doctor(
    facts: Optional[Facts] = None, groups: Optional[Sequence[Tuple[str, Sequence[Check]]]] = None
) -> DoctorResult:
    """Run ``groups`` of checks (default: :data:`CHECK_GROUPS`) against ``facts`` (default: this machine, now)."""
    facts = Facts() if facts is None else facts
    groups = CHECK_GROUPS if groups is None else groups
    return DoctorResult(
        tuple((title, tuple(f for check in checks for f in run_check(check, facts))) for title, checks in groups)
    )
