"""What the checks ask about the machine, each answered once, on first use, in a safe order.

Several checks need the same expensive or dangerous answers (does ``import torch`` work? which CANN?), and the order
matters: torch must be tried in a child process before this process imports it, because a torch_npu wheel without
CANN makes ``import torch`` itself raise. When that is the only problem, the doctor sets
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` for its own process (torch then skips torch_npu) so the remaining checks still
run; :attr:`Facts.autoload_disabled_by_doctor` records that it did, so a finding can say so.
"""

from __future__ import annotations

import functools
import os
from functools import cached_property
from types import ModuleType
from typing import Callable, Dict, List, Mapping, Optional

from .._optional import installed_version
from .cann import CannInstall, locate_cann
from .finding import Finding, check_id
from .probes import ImportOutcome, ProbeOutcome, import_in_subprocess, probe_in_subprocess

AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: What torch prints when an auto-loaded device backend (here torch_npu) fails during ``import torch``.
AUTOLOAD_FAILURE = "Failed to load the backend extension: torch_npu"


class Facts:
    """Lazily computed answers; tests replace one by assigning the attribute before a check reads it."""

    def __init__(self, environ: Optional[Mapping[str, str]] = None):
        #: The environment as the user gave it, before the doctor changes anything in its own process.
        self.environ: Dict[str, str] = dict(os.environ if environ is None else environ)
        self.autoload_disabled_by_doctor = False
        self.torch_error: Optional[str] = None

    @cached_property
    def torch_version(self) -> Optional[str]:
        return installed_version("torch")

    @cached_property
    def torch_npu_version(self) -> Optional[str]:
        return installed_version("torch-npu", "torch_npu")

    @property
    def torch_npu_installed(self) -> bool:
        return self.torch_npu_version is not None

    @cached_property
    def torch_import(self) -> ImportOutcome:
        """``import torch`` in a child process, with the user's environment (autoload as they have it)."""
        return import_in_subprocess("torch", self.environ)

    @property
    def torch_import_blocked_by_torch_npu(self) -> bool:
        return not self.torch_import.ok and AUTOLOAD_FAILURE in self.torch_import.output

    @cached_property
    def torch_npu_import(self) -> Optional[ImportOutcome]:
        """``import torch_npu`` in a child process with autoload off, so the error shown is torch_npu's own."""
        if not self.torch_npu_installed:
            return None
        return import_in_subprocess("torch_npu", {**self.environ, AUTOLOAD_VARIABLE: "0"})

    @property
    def torch_npu_broken(self) -> bool:
        return self.torch_npu_import is not None and not self.torch_npu_import.ok

    @cached_property
    def integration_probe(self) -> ProbeOutcome:
        """Each integration applied to a tiny model in a child process (:mod:`.integration_probe`)."""
        return probe_in_subprocess(self.environ)

    @cached_property
    def cann(self) -> CannInstall:
        return locate_cann(self.environ)

    @cached_property
    def torch(self) -> Optional[ModuleType]:
        """torch imported into this process, or None (with :attr:`torch_error`) when that cannot be done safely."""
        if not self.torch_import.ok:
            if not self.torch_import_blocked_by_torch_npu or os.environ.get(AUTOLOAD_VARIABLE) == "0":
                self.torch_error = self.torch_import.error
                return None
            os.environ[AUTOLOAD_VARIABLE] = "0"
            self.autoload_disabled_by_doctor = True
        try:
            import torch
        except Exception as exc:  # noqa: BLE001 - the child said it works; whatever breaks here is reported
            self.torch_error = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
            return None
        return torch

    @cached_property
    def npu_usable(self) -> bool:
        """torch_npu imports here and sees at least one NPU (what makes Ascend settings matter)."""
        if self.torch is None or not self.torch_npu_installed or self.torch_npu_broken:
            return False
        from ..device.detect import backend_status

        return backend_status("npu").available


Check = Callable[[Facts], List[Finding]]


def needs_torch(check: Check) -> Check:
    """Run ``check`` only when torch is importable here; otherwise one finding says it was skipped, and why."""

    @functools.wraps(check)
    def guarded(facts: Facts) -> List[Finding]:
        if facts.torch is None:
            name = check_id(check)
            return [
                Finding(
                    name,
                    name.replace("-", " "),
                    "info",
                    "skipped: torch cannot be imported (see the torch finding above)",
                    "fix the torch finding above, then run npu-port doctor again",
                    {"torch_error": facts.torch_error},
                )
            ]
        return check(facts)

    return guarded
