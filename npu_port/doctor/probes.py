"""Asking about a package without letting it take the doctor down.

Importing a broken native package can raise from deep inside torch, print to the terminal, or kill the process
(a segfault in a mismatched extension). So imports are tried in a child Python first, with the output captured, and
versions are read from the installed metadata, which never runs the package's code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Mapping, Optional

#: Long enough for a cold ``import torch`` on a slow disk; short enough that a hung driver does not hang the doctor.
IMPORT_TIMEOUT_S = 120

#: ``ImportError: ...``, ``torch._C.SomeError: ...``, a bare ``KeyboardInterrupt``; not ``Warning: ...`` lines that
#: packages print while importing.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Iteration)(:|$)")


@dataclass(frozen=True)
class ImportOutcome:
    """What ``python -c "import <module>"`` did in a child process."""

    module: str
    returncode: Optional[int]  # None: killed by the timeout
    output: str  # stderr and stdout, as captured
    timeout_s: float = IMPORT_TIMEOUT_S

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def exception_lines(self) -> List[str]:
        """The ``Type: message`` lines of every traceback in the output, innermost cause first.

        With chained exceptions Python prints the cause first, so for ``import torch`` failing on torch_npu the
        list is ``["ImportError: libhccl.so: ...", "RuntimeError: Failed to load the backend extension: ..."]``.
        """
        return [line.strip() for line in self.output.splitlines() if _EXCEPTION_LINE.match(line)]

    @property
    def error(self) -> str:
        """The exception that ended the import (the last one printed), or why there is none."""
        if self.ok:
            return ""
        if self.returncode is None:
            return f"import {self.module} did not finish within {self.timeout_s:g} s"
        lines = self.exception_lines()
        if lines:
            return lines[-1]
        if self.returncode < 0:
            return f"import {self.module} killed the Python process (signal {-self.returncode})"
        tail = [line.strip() for line in self.output.splitlines() if line.strip()]
        return tail[-1] if tail else f"import {self.module} exited with code {self.returncode}"

    @property
    def cause(self) -> str:
        """The innermost exception (the real error behind a chain), or :attr:`error` when there is no chain."""
        lines = self.exception_lines()
        return lines[0] if lines else self.error


def import_in_subprocess(
    module: str, environ: Optional[Mapping[str, str]] = None, timeout_s: float = IMPORT_TIMEOUT_S
) -> ImportOutcome:
    """Try ``import module`` in a fresh interpreter (this one's ``sys.executable``) with ``environ``."""
    env = dict(os.environ if environ is None else environ)
    try:
        completed = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
        return ImportOutcome(module, None, output, timeout_s)
    return ImportOutcome(module, completed.returncode, completed.stdout, timeout_s)


#: The integration probe imports torch, transformers and diffusers and runs two tiny models: a minute at most.
PROBE_TIMEOUT_S = 300


@dataclass(frozen=True)
class ProbeOutcome:
    """What ``python -m npu_port.doctor.integration_probe`` printed (its JSON), or why there is none."""

    data: Optional[dict]
    error: str = ""


def probe_in_subprocess(
    environ: Optional[Mapping[str, str]] = None, timeout_s: float = PROBE_TIMEOUT_S
) -> ProbeOutcome:
    """Run the integration probe in a fresh interpreter: a library that crashes on import cannot take us down."""
    import json

    env = dict(os.environ if environ is None else environ)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "npu_port.doctor.integration_probe"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return ProbeOutcome(None, f"the integration probe did not finish within {timeout_s:g} s")
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        outcome = ImportOutcome("npu_port.doctor.integration_probe", completed.returncode, completed.stderr)
        return ProbeOutcome(None, outcome.cause or f"the integration probe exited with code {completed.returncode}")
    try:
        return ProbeOutcome(json.loads(lines[-1]))
    except ValueError as exc:
        return ProbeOutcome(None, f"the integration probe printed no readable result ({exc})")


def major_minor(version: Optional[str]) -> Optional[str]:
    """``"2.13.0+cpu"`` -> ``"2.13"``, ``"2.13.0.post1"`` -> ``"2.13"``; None when there is no such prefix."""
    release = release_tuple(version or "")
    return f"{release[0]}.{release[1]}" if len(release) >= 2 else None


def release_tuple(version: str) -> tuple:
    """The numeric release of a version string, for range checks: ``"0.42.1"`` -> ``(0, 42, 1)``.

    Pre-release and local suffixes are cut off (``"0.43.0.dev0"`` -> ``(0, 43, 0)``), which is what "fixed in" ranges
    need; it avoids depending on ``packaging`` in an environment that may be half broken.
    """
    numbers = []
    for part in version.split("+", 1)[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers)
