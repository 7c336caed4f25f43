"""Python and torch: the two things every other check stands on.

``import torch`` is tried in a child process first (see :mod:`.facts`): on an Ascend machine whose CANN is not
sourced it fails inside torch's device-backend autoload, and the useful answer is torch_npu's error, not torch's.
"""

from __future__ import annotations

import sys
from typing import List

from .diagnosis import diagnose_torch_npu_error
from .facts import AUTOLOAD_VARIABLE, Facts
from .finding import Finding

MINIMUM_PYTHON = (3, 9)


def check_python_version(facts: Facts) -> List[Finding]:
    version = ".".join(str(part) for part in sys.version_info[:3])
    details = {"version": version, "executable": sys.executable}
    if sys.version_info[:2] < MINIMUM_PYTHON:
        minimum = ".".join(map(str, MINIMUM_PYTHON))
        return [
            Finding(
                "python-version",
                "Python",
                "error",
                f"Python {version} is older than {minimum}, the oldest npu-port (and current torch) supports",
                f"create a virtual environment with Python {minimum} or newer",
                details,
            )
        ]
    return [Finding("python-version", "Python", "info", f"Python {version} ({sys.executable})", None, details)]


def check_torch(facts: Facts) -> List[Finding]:
    outcome = facts.torch_import
    if outcome.ok:
        return [_torch_build(facts)]
    details = {"error": outcome.error, "cause": outcome.cause, "version": facts.torch_version}
    if facts.torch_version is None:
        return [
            Finding(
                "torch-import",
                "torch",
                "error",
                "torch is not installed",
                "pip install torch (on Ascend: the release your torch-npu pairs with)",
                details,
            )
        ]
    if not facts.torch_import_blocked_by_torch_npu:
        return [
            Finding(
                "torch-import",
                "torch",
                "error",
                f"import torch {facts.torch_version} fails: {outcome.error}",
                "reinstall torch (pip install --force-reinstall torch) in this environment",
                details,
            )
        ]
    diagnosis = diagnose_torch_npu_error(outcome.output, facts.cann, facts.torch_version)
    findings = [
        Finding(
            "torch-import",
            "torch",
            "error",
            f"import torch fails: torch auto-loads torch_npu, which cannot load ({diagnosis.summary})",
            f"{diagnosis.fix}; or export {AUTOLOAD_VARIABLE}=0 to import torch without torch_npu",
            {**details, "diagnosis": diagnosis.kind},
        )
    ]
    if facts.torch is not None and facts.autoload_disabled_by_doctor:
        findings.append(
            Finding(
                "doctor-autoload-override",
                "doctor's own torch",
                "info",
                f"the doctor set {AUTOLOAD_VARIABLE}=0 in its own process, so the checks below run without torch_npu",
                None,
            )
        )
        findings.append(_torch_build(facts, f" with {AUTOLOAD_VARIABLE}=0"))
    return findings


def _torch_build(facts: Facts, how: str = "") -> Finding:
    torch = facts.torch
    if torch is None:
        return Finding(
            "torch-import",
            "torch",
            "error",
            f"torch imports in a child process but not in the doctor's: {facts.torch_error}",
            "please report this",
            {"error": facts.torch_error},
        )
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"CUDA {cuda} build" if cuda else f"ROCm (HIP {hip}) build" if hip else "CPU build (no CUDA or ROCm)"
    return Finding(
        "torch",
        "torch",
        "ok",
        f"torch {torch.__version__} imports{how}; {build}",
        None,
        {"version": torch.__version__, "cuda": cuda, "hip": hip},
    )
