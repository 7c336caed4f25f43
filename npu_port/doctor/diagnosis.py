"""Turning a failed ``import torch_npu`` into its cause and its fix.

The raw errors are famously unhelpful ("libhccl.so: cannot open shared object file", "undefined symbol:
_ZN3c10..."), yet each of the common ones has exactly one usual cause (docs/how-to/fix-a-cann-error.md). The
classification works on the captured error text, so it is the same for a child process's output and for tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .cann import CannInstall
from .pairing import pip_pair

#: CANN runtime libraries: missing means set_env.sh was not sourced (or CANN is not installed).
_CANN_LIBRARY = re.compile(r"(lib(?:hccl|ascendcl|opapi|acl\w*)\.so[\w.]*)")
_ATB_LIBRARY = re.compile(r"(libatb\.so[\w.]*)")
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
_UNDEFINED_SYMBOL = re.compile(r"undefined symbol:?\s*(\S+)")
#: Import names whose pip distribution has another name.
_PIP_NAMES = {"yaml": "pyyaml", "google": "protobuf", "attr": "attrs"}


@dataclass(frozen=True)
class Diagnosis:
    """Why torch_npu cannot be imported: a stable ``kind``, the finding status, one-line summary and fix."""

    kind: str
    status: str
    summary: str
    fix: str


def torch_npu_pin(torch_version: Optional[str]) -> str:
    """The pip arguments for the torch_npu release that pairs with ``torch_version`` (for a torch newer than every
    torch_npu, the newest pair with torch pinned too): :func:`.pairing.pip_pair`."""
    return pip_pair(torch_version)


def diagnose_torch_npu_error(error_text: str, cann: CannInstall, torch_version: Optional[str]) -> Diagnosis:
    """Classify the output of a failed ``import torch_npu`` (all of it: the cause may be anywhere in a chain)."""
    missing_module = _MISSING_MODULE.search(error_text)
    if missing_module and missing_module.group(1).split(".")[0] == "torch_npu":
        return Diagnosis(
            "not-installed",
            "info",
            "torch_npu is not installed (fine unless this is an Ascend machine)",
            f"on Ascend: install CANN, source its set_env.sh, then pip install {torch_npu_pin(torch_version)}",
        )
    library = _CANN_LIBRARY.search(error_text)
    if library and "cannot open shared object file" in error_text:
        if cann.home is None:
            return Diagnosis(
                "cann-not-sourced",
                "error",
                f"CANN's environment is not set, and no CANN toolkit was found: {library.group(1)} cannot be found",
                f"install CANN, then source {cann.set_env_script} (off Ascend: pip uninstall torch-npu)",
            )
        return Diagnosis(
            "cann-not-sourced",
            "error",
            f"CANN's environment is not set: {library.group(1)} cannot be found",
            f"source {cann.set_env_script}",
        )
    atb = _ATB_LIBRARY.search(error_text)
    if atb:
        return Diagnosis(
            "atb-not-sourced",
            "error",
            f"the ATB (NNAL) environment is not set: {atb.group(1)} cannot be found",
            f"source {cann.atb_set_env_script}",
        )
    symbol = _UNDEFINED_SYMBOL.search(error_text)
    if symbol:
        return Diagnosis(
            "version-mismatch",
            "error",
            f"torch_npu does not pair with this torch or CANN (undefined symbol {symbol.group(1)})",
            f"pin the same release: pip install {torch_npu_pin(torch_version)}, with the CANN version listed "
            "for that torch_npu release",
        )
    if missing_module:
        module = missing_module.group(1).split(".")[0]
        return Diagnosis(
            "missing-dependency",
            "error",
            f"a Python package torch_npu needs is missing: {module}",
            f"pip install {_PIP_NAMES.get(module, module)}",
        )
    last_line = [line.strip() for line in error_text.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    return Diagnosis(
        "import-failed",
        "error",
        f"torch_npu cannot be imported: {last_line[0]}",
        f"reinstall a torch_npu that pairs with torch ({torch_npu_pin(torch_version)}) and source CANN's set_env.sh",
    )
