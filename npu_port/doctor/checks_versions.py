"""Versions and integrations: what is installed against what npu-port supports and last tested, and whether each
integration routes here.

Why: a release of transformers once broke every pipeline run four days after it came out while the doctor said
nothing. Two checks close that gap. :func:`check_versions` compares each installed library with the support policy
(:mod:`npu_port.support`) and with what the CI lanes last ran (the record shipped in the package): older than
supported is a warning; newer than the newest tested is a note that says what to do if something breaks. And
:func:`check_integrations` applies a strategy to a tiny model of each library in a child process
(:mod:`.integration_probe`): "routes", "declines: why" (a warning: the model runs, on the library's own, slower
path), or an error — so the doctor is never green while the main job is broken.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .. import support
from .._optional import installed_version
from .facts import Facts
from .finding import Finding
from .probes import release_tuple

#: How a user gets the tested set back (the constraints file of the locked CI lane, in a checkout).
TESTED_SET_HINT = 'pip install -e ".[diffusers]" -c .ci/constraints/locked.txt (in an npu-port checkout)'


def _newest_tested(package: str, record: Optional[Dict[str, Any]]) -> Optional[support.TestedLane]:
    lanes = [lane for lane in support.tested_versions(package, record) if lane.passed]
    return max(lanes, key=lambda lane: release_tuple(lane.version)) if lanes else None


def _version_finding(entry: support.Supported, version: str, record: Optional[Dict[str, Any]]) -> Finding:
    check, title = f"version-{entry.package.replace('_', '-')}", f"{entry.package} version"
    details: Dict[str, Any] = {"installed": version, "minimum": entry.minimum}
    if release_tuple(version) < release_tuple(entry.minimum):
        return Finding(
            check,
            title,
            "warn",
            f"{entry.package} {version} is older than npu-port supports ({entry.minimum}: {entry.why})",
            f'pip install "{entry.requirement}"',
            details,
        )
    tested = support.tested_versions(entry.package, record)
    details["tested"] = [lane._asdict() for lane in tested]
    newest = _newest_tested(entry.package, record)
    if record is None:
        return Finding(
            check, title, "info", f"{entry.package} {version}: no test record to compare with", None, details
        )
    same = [lane.lane for lane in tested if lane.version == version and lane.passed]
    if same:
        summary = f"{entry.package} {version}: tested, passed (CI lanes: {', '.join(same)})"
        return Finding(check, title, "ok", summary, None, details)
    if newest is not None and release_tuple(version) > release_tuple(newest.version):
        return Finding(
            check,
            title,
            "info",
            f"{entry.package} {version} is newer than the newest tested ({newest.version}, {newest.date}); "
            "npu-port declines what it cannot use, so it should run",
            f'if something breaks, pip install "{entry.package}=={newest.version}" or the whole tested set: '
            f"{TESTED_SET_HINT}, and report it",
            details,
        )
    summary = f"{entry.package} {version}: within the supported range (from {entry.minimum}), not itself tested"
    return Finding(check, title, "info", summary, None, details)


def check_versions(facts: Facts) -> List[Finding]:
    """Each policy library that is installed, against the supported range and the CI lanes' record."""
    record = support.tested()
    findings = []
    for entry in support.POLICY:
        version = facts.torch_version if entry.package == "torch" else installed_version(entry.package)
        if version is not None:
            findings.append(_version_finding(entry, version, record))
    return findings


def _claimed(library: str, feature: str, version: Optional[str]) -> bool:
    """Whether the policy claims ``feature``'s modern path for this version of ``library``."""
    entry = support.BY_PACKAGE.get(library)
    since = entry.features.get(feature) if entry is not None else None
    return since is not None and version is not None and release_tuple(version) >= release_tuple(since)


def _upgrade_hint(library: str) -> str:
    """Where the policy claims every modern path of ``library``: the release to install, if the project allows."""
    entry = support.BY_PACKAGE.get(library)
    if entry is None or not entry.features:
        return "see the compatibility table in README.md (docs/explanation/versions.md: the supported ranges)"
    newest = max(entry.features.values(), key=release_tuple)
    return f'to route them: pip install "{library}>={newest}", if your project allows it'


def check_integrations(facts: Facts) -> List[Finding]:
    """Each integration applied to a tiny model (in a child process), and each adapter's features."""
    outcome = facts.integration_probe
    if outcome.data is None:
        return [
            Finding(
                "integrations",
                "integrations",
                "error",
                f"the integration probe failed: {outcome.error}",
                "run `python -m npu_port.doctor.integration_probe` to see the whole error, and report it",
            )
        ]
    findings = []
    capabilities = outcome.data.get("capabilities", {})
    for library, result in outcome.data.get("probes", {}).items():
        status, detail = result.get("status"), str(result.get("detail", ""))
        version = (capabilities.get(library) or {}).get("version")
        check, title = f"integration-{library}", f"{library} integration"
        if status == "absent":
            findings.append(Finding(check, title, "info", f"{library} is not installed", None, result))
        elif status == "routes":
            findings.append(Finding(check, title, "ok", f"{library} {version}: routes ({detail})", None, result))
        elif status == "declines":
            fix = f"{library} runs these itself, as without npu-port; {_upgrade_hint(library)}"
            findings.append(
                Finding(check, title, "warn", f"{library} {version}: declines ({detail})", fix, result, "declined")
            )
        else:
            findings.append(
                Finding(
                    check,
                    title,
                    "error",
                    f"{library} {version}: applying a strategy fails: {detail}",
                    f"report it; meanwhile {TESTED_SET_HINT}",
                    result,
                    "integration-error",
                )
            )
    for library, info in capabilities.items():
        version = info.get("version")
        if version is None:
            continue
        missing = {feature: why for feature, why in info.get("features", {}).items() if why}
        unexpected = {f: why for f, why in missing.items() if _claimed(library, f, version)}
        details = {"version": version, "features": info.get("features", {})}
        total = len(info.get("features", {}))
        if not missing:
            summary = f"{library} {version}: all {total} integration features found"
            findings.append(Finding(f"pieces-{library}", f"{library} pieces", "ok", summary, None, details))
            continue
        names = "; ".join(f"{feature} ({why})" for feature, why in missing.items())
        findings.append(
            Finding(
                f"pieces-{library}",
                f"{library} pieces",
                "warn" if unexpected else "info",
                f"{library} {version}: {len(missing)} of {total} integration features decline: {names}",
                f"a change in {library} npu-port does not know yet: report it" if unexpected else None,
                details,
            )
        )
    return findings
