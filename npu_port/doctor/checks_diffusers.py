"""diffusers: which version is installed, and which of its known NPU bugs apply to it.

diffusers is never imported here: it imports torch_npu whenever the package is installed, so with a broken torch_npu
``import diffusers`` itself fails on libhccl.so. The version comes from the installed metadata.
"""

from __future__ import annotations

from typing import List

from .._optional import installed_version
from .diffusers_bugs import KNOWN_BUGS
from .facts import Facts
from .finding import Finding


def check_diffusers(facts: Facts) -> List[Finding]:
    version = installed_version("diffusers")
    if version is None:
        return [
            Finding(
                "diffusers",
                "diffusers",
                "info",
                "diffusers is not installed (only diffusers pipelines need it)",
                None,
            )
        ]
    bugs = [bug for bug in KNOWN_BUGS if bug.affects(version)]
    findings = [
        Finding(
            "diffusers",
            "diffusers",
            "info",
            f"diffusers {version} is installed; {len(bugs)} known NPU bug(s) apply to it",
            None,
            {"version": version, "known_bugs": [bug.id for bug in bugs]},
        )
    ]
    for bug in bugs:
        breaks = bug.breaks_here(facts)
        findings.append(
            Finding(
                f"diffusers-{bug.id}",
                f"diffusers bug: {bug.id}",
                "warn" if breaks else "info",
                f"{bug.summary} ({bug.reference}; {bug.range_text}); {bug.npu_port}",
                bug.fix,
                {"reference": bug.reference, "since": bug.since, "fixed_in": bug.fixed_in, "breaks_here": breaks},
            )
        )
    return findings
