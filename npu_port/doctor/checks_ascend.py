"""The Ascend stack: torch_npu (installed, importable, paired with torch), the autoload switch, and CANN.

Off Ascend none of this is a problem, so everything is informational when torch_npu is not installed. Once the
torch-npu wheel is installed it is loaded by ``import torch`` itself (torch >= 2.5 auto-loads device backends), so a
broken torch_npu or an unsourced CANN is an error: it breaks torch, diffusers, and every script on the machine.
"""

from __future__ import annotations

from typing import List

from . import pairing
from .diagnosis import diagnose_torch_npu_error, torch_npu_pin
from .facts import AUTOLOAD_VARIABLE, Facts
from .finding import Finding
from .probes import major_minor

_AUTOLOAD_WORKAROUND = f"export {AUTOLOAD_VARIABLE}=0 imports torch without torch_npu"


def check_torch_npu(facts: Facts) -> List[Finding]:
    version = facts.torch_npu_version
    if version is None:
        return [
            Finding(
                "torch-npu",
                "torch_npu",
                "info",
                "torch_npu is not installed (fine unless this is an Ascend machine)",
                f"on Ascend: install CANN, source its set_env.sh, then pip install "
                f"{torch_npu_pin(facts.torch_version)}{pairing.no_release_note(facts.torch_version)}",
            )
        ]
    outcome = facts.torch_npu_import
    if outcome.ok:
        return [Finding("torch-npu", "torch_npu", "ok", f"torch_npu {version} imports", None, {"version": version})]
    diagnosis = diagnose_torch_npu_error(outcome.output, facts.cann, facts.torch_version)
    fix = diagnosis.fix
    if facts.environ.get(AUTOLOAD_VARIABLE) != "0":
        fix += f"; meanwhile, {_AUTOLOAD_WORKAROUND}"
    return [
        Finding(
            "torch-npu-import",
            "torch_npu",
            diagnosis.status,
            f"torch_npu {version} is installed but cannot be imported: {diagnosis.summary}",
            fix,
            {"version": version, "diagnosis": diagnosis.kind, "error": outcome.error, "cause": outcome.cause},
        )
    ]


def check_torch_npu_pairing(facts: Facts) -> List[Finding]:
    """torch_npu is built against one torch release; another major.minor fails with undefined symbols."""
    torch_version, npu_version = facts.torch_version, facts.torch_npu_version
    if npu_version is None or torch_version is None:
        return []
    details = {"torch": torch_version, "torch_npu": npu_version}
    torch_series, npu_series = major_minor(torch_version), major_minor(npu_version)
    if torch_series == npu_series:
        return [
            Finding(
                "torch-npu-pairing",
                "torch / torch_npu pairing",
                "ok",
                f"torch {torch_version} and torch_npu {npu_version} are the same release ({torch_series})",
                None,
                details,
            )
        ]
    return [
        Finding(
            "torch-npu-pairing",
            "torch / torch_npu pairing",
            "error",
            f"torch {torch_version} does not pair with torch_npu {npu_version} (the major.minor must match)"
            f"{pairing.no_release_note(torch_version)}",
            f'pip install {torch_npu_pin(torch_version)}, or pin torch to match: pip install "torch=={npu_series}.*"',
            details,
        )
    ]


def check_torch_npu_cann(facts: Facts) -> List[Finding]:
    """The CANN found against the one Ascend lists for the installed torch_npu (:mod:`.pairing`).

    A documented mismatch warns (it is how ``libtbe_adapter.so: undefined symbol`` and ``init env failed`` happen);
    an inferred pairing (torch-npu 2.13 / 2.14, not yet in Ascend's table) only informs.
    """
    npu_version = facts.torch_npu_version
    if npu_version is None:
        return []
    row = pairing.pairing_of(npu_version)
    found = facts.cann.version
    details = {"torch_npu": npu_version, "cann_found": found, "pairing": row.as_dict() if row else None}
    title = "torch_npu / CANN pairing"
    if row is None:
        return [
            Finding(
                "torch-npu-cann",
                title,
                "info",
                f"torch_npu {npu_version} is not in npu-port's pairing table; CANN found: {found or 'unknown'}",
                f"use the CANN version Ascend lists for torch-npu {npu_version}: {pairing.COMPATIBILITY}",
                details,
            )
        ]
    listed = f"torch-npu {row.torch_npu}" + ("" if row.torch_npu == npu_version.split("+")[0] else " (its series)")
    if found is None:
        return [
            Finding(
                "torch-npu-cann",
                title,
                "info",
                f"CANN version unknown; {listed} is listed with {row.cann_text}",
                None,
                details,
            )
        ]
    if pairing.cann_matches(found, row.cann):
        return [Finding("torch-npu-cann", title, "ok", f"CANN {found} is the one listed for {listed}", None, details)]
    fix = f"install CANN {row.cann}"
    others = [other for other in pairing.releases(row.series) if other.cann and pairing.cann_matches(found, other.cann)]
    if others:
        fix += f', or pip install "torch-npu=={others[0].torch_npu}" (listed for CANN {others[0].cann})'
    if row.cann_inferred:
        return [
            Finding(
                "torch-npu-cann",
                title,
                "info",
                f"CANN {found} found; {listed} is expected with {row.cann_text}: Ascend lists no CANN for it yet",
                fix,
                details,
            )
        ]
    return [
        Finding(
            "torch-npu-cann",
            title,
            "warn",
            f"CANN {found} found, but {listed} is listed with {row.cann_text}",
            fix,
            details,
        )
    ]


def check_backend_autoload(facts: Facts) -> List[Finding]:
    value = facts.environ.get(AUTOLOAD_VARIABLE)
    details = {"value": value}
    if value == "0":
        return [
            Finding(
                "backend-autoload",
                AUTOLOAD_VARIABLE,
                "info",
                f"{AUTOLOAD_VARIABLE}=0: import torch does not load torch_npu; code must import torch_npu itself "
                "(npu-port does when it needs it)",
                None,
                details,
            )
        ]
    shown = "unset" if value is None else f"{value!r}"
    if facts.torch_npu_broken:
        return [
            Finding(
                "backend-autoload",
                AUTOLOAD_VARIABLE,
                "warn",
                f"{AUTOLOAD_VARIABLE} is {shown}: import torch loads the broken torch_npu and fails with it",
                f"fix torch_npu (see above); meanwhile {_AUTOLOAD_WORKAROUND}",
                details,
            )
        ]
    return [
        Finding(
            "backend-autoload",
            AUTOLOAD_VARIABLE,
            "info",
            f"{AUTOLOAD_VARIABLE} is {shown}: import torch also loads installed device backends such as torch_npu",
            None,
            details,
        )
    ]


def check_cann(facts: Facts) -> List[Finding]:
    return [_toolkit_finding(facts), _libraries_finding(facts)]


def _toolkit_finding(facts: Facts) -> Finding:
    cann = facts.cann
    details = {"home": cann.home, "source": cann.home_source, "version": cann.version, "file": cann.version_file}
    if cann.home is None:
        if facts.torch_npu_installed:
            return Finding(
                "cann-toolkit",
                "CANN toolkit",
                "error",
                "no CANN toolkit: ASCEND_HOME_PATH is unset and none is installed in /usr/local/Ascend",
                f"install the CANN toolkit and kernels for your chip, then source {cann.set_env_script} "
                "(off Ascend: pip uninstall torch-npu)",
                details,
            )
        return Finding(
            "cann-toolkit",
            "CANN toolkit",
            "info",
            "no CANN toolkit (not an Ascend machine, or CANN not installed)",
            None,
            details,
        )
    version = f"CANN {cann.version}" if cann.version else "CANN of unknown version (no version file found)"
    return Finding(
        "cann-toolkit", "CANN toolkit", "ok", f"{version} at {cann.home} ({cann.home_source})", None, details
    )


def _libraries_finding(facts: Facts) -> Finding:
    cann = facts.cann
    details = {"libraries": dict(cann.libraries), "LD_LIBRARY_PATH": facts.environ.get("LD_LIBRARY_PATH", "")}
    missing = cann.missing_libraries
    if not missing:
        return Finding(
            "cann-libraries",
            "CANN libraries",
            "ok",
            f"the loader finds {', '.join(cann.libraries)}",
            None,
            details,
        )
    if facts.torch_npu_installed:
        return Finding(
            "cann-libraries",
            "CANN libraries",
            "error",
            f"CANN environment not sourced ({', '.join(missing)} missing from LD_LIBRARY_PATH)",
            f"source {cann.set_env_script}",
            details,
        )
    return Finding(
        "cann-libraries",
        "CANN libraries",
        "info",
        f"{', '.join(missing)} not found (not an Ascend machine, or CANN not installed or sourced)",
        None,
        details,
    )
