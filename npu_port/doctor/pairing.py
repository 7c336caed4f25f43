"""Which torch each torch-npu release is built for, and which CANN it is listed with: one table for the doctor's
checks, its ``--json`` report and README_NPU.md.

torch-npu is built against one torch release (its wheel metadata pins it: torch-npu 2.14.0 and 2.13.0 say
``Requires-Dist: torch==2.14.0.*`` / ``torch==2.13.0.*``), and each torch-npu release is tested with one CANN. A
mismatch fails late and cryptically (``undefined symbol`` at import, ``init env failed`` at the first ``.npu()``),
so the pairing is data the checks read rather than a rule scattered through messages.

Sources, read 2026-11-23:

- Ascend/pytorch ``COMPATIBILITY.en.md`` ("TorchNPU version mapping table" and the recommended combination
  torch-npu 2.12.0 / PyTorch 2.12.0 / CANN 9.1.0): every row below with a documented CANN.
- Ascend/pytorch ``SUPPORT.en.md``: torch-npu 2.13.0 and 2.14.0 "Expected to be released in 2026/10", with no CANN
  row yet; the README inside the torch-npu 2.14.0 wheel still says "Install CANN 9.1.0". So CANN 9.1 for 2.13 / 2.14
  is *inferred* (marked so), not documented.
- PyPI (``pip index versions``): torch-npu 2.14.0 is the newest release; torch 2.15.0 exists with no torch-npu.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .probes import major_minor, release_tuple

COMPATIBILITY = "https://github.com/Ascend/pytorch/blob/master/COMPATIBILITY.en.md"
SUPPORT = "https://github.com/Ascend/pytorch/blob/master/SUPPORT.en.md"
PYPI = "https://pypi.org/project/torch-npu/#history"
#: When the table was last checked against its sources (the date in a "no torch-npu yet" line).
CHECKED = "2026-11-23"


@dataclass(frozen=True)
class Pairing:
    """One torch-npu release (or, with ``torch_npu`` None, a torch release that has none yet)."""

    torch: str
    torch_npu: Optional[str]
    cann: Optional[str]
    #: True when ``cann`` is not in Ascend's table but inferred from the release notes (see the module docstring)
    cann_inferred: bool = False
    source: str = COMPATIBILITY

    @property
    def series(self) -> str:
        return major_minor(self.torch) or self.torch

    @property
    def cann_text(self) -> str:
        if self.cann is None:
            return "-"
        return f"CANN {self.cann} (inferred)" if self.cann_inferred else f"CANN {self.cann}"

    def as_dict(self) -> Dict[str, Any]:
        return {
            "torch": self.torch,
            "torch_npu": self.torch_npu,
            "cann": self.cann,
            "cann_inferred": self.cann_inferred,
            "source": self.source,
        }


#: Newest first; within a torch series, the newest torch-npu release first (the one to install).
PAIRINGS: Tuple[Pairing, ...] = (
    Pairing("2.15.0", None, None, source=PYPI),
    Pairing("2.14.0", "2.14.0", "9.1.x", cann_inferred=True, source=SUPPORT),
    Pairing("2.13.0", "2.13.0", "9.1.x", cann_inferred=True, source=SUPPORT),
    Pairing("2.12.0", "2.12.0", "9.1.0"),
    Pairing("2.11.0", "2.11.0", "9.1.0"),
    Pairing("2.10.0", "2.10.0.post4", "9.1.0"),
    Pairing("2.9.0", "2.9.0.post6", "9.1.0"),
    Pairing("2.9.0", "2.9.0.post2", "9.0.0"),
    Pairing("2.9.0", "2.9.0", "8.5.0"),
    Pairing("2.8.0", "2.8.0.post4", "9.0.0"),
    Pairing("2.8.0", "2.8.0.post2", "8.5.0"),
    Pairing("2.8.0", "2.8.0", "8.3.RC1"),
    Pairing("2.7.1", "2.7.1.post8", "9.1.0"),
    Pairing("2.7.1", "2.7.1.post4", "9.0.0"),
    Pairing("2.7.1", "2.7.1.post2", "8.5.0"),
    Pairing("2.7.1", "2.7.1", "8.3.RC1"),
    Pairing("2.6.0", "2.6.0.post5", "8.5.0"),
    Pairing("2.6.0", "2.6.0.post3", "8.3.RC1"),
    Pairing("2.6.0", "2.6.0", "8.2.RC1"),
    Pairing("2.5.1", "2.5.1.post1", "8.2.RC1"),
    Pairing("2.5.1", "2.5.1", "8.1.RC1"),
    Pairing("2.4.0", "2.4.0.post4", "8.1.RC1"),
    Pairing("2.4.0", "2.4.0.post2", "8.0.0"),
    Pairing("2.3.1", "2.3.1.post6", "8.1.RC1"),
    Pairing("2.3.1", "2.3.1.post4", "8.0.0"),
    Pairing("2.1.0", "2.1.0.post17", "8.3.RC1"),
    Pairing("2.1.0", "2.1.0.post13", "8.2.RC1"),
    Pairing("2.1.0", "2.1.0.post12", "8.1.RC1"),
    Pairing("2.1.0", "2.1.0.post10", "8.0.0"),
)


def releases(series: Optional[str]) -> List[Pairing]:
    """The torch-npu releases for a torch ``major.minor``, newest first (empty when there is none)."""
    return [row for row in PAIRINGS if row.series == series and row.torch_npu is not None]


def newest_release() -> Pairing:
    return next(row for row in PAIRINGS if row.torch_npu is not None)


def unreleased(series: Optional[str]) -> Optional[Pairing]:
    """The row saying ``series`` exists with no torch-npu yet, or None."""
    return next((row for row in PAIRINGS if row.series == series and row.torch_npu is None), None)


def pairing_of(torch_npu_version: Optional[str]) -> Optional[Pairing]:
    """The row of an installed torch-npu: its exact release, else the newest release of its series, else None.

    A ``.postN`` missing from the table (Ascend publishes more than it lists) falls back to its series, whose
    newest row carries the CANN Ascend lists for that series now.
    """
    if not torch_npu_version:
        return None
    version = torch_npu_version.split("+", 1)[0]
    exact = next((row for row in PAIRINGS if row.torch_npu == version), None)
    if exact is not None:
        return exact
    rows = releases(major_minor(version))
    return rows[0] if rows else None


def without_torch_npu(series: Optional[str]) -> bool:
    """Whether torch ``series`` is newer than every torch-npu (torch 2.15 today): no torch-npu can pair with it."""
    if series is None or releases(series):
        return False
    return unreleased(series) is not None or release_tuple(series) > release_tuple(newest_release().series)


def pip_pair(torch_version: Optional[str]) -> str:
    """pip arguments for a torch-npu that works with ``torch_version``: its own series, or (for a torch newer than any
    torch-npu) the newest pair, torch pin included."""
    series = major_minor(torch_version)
    if series is None:
        return "torch-npu of the same major.minor as torch"
    if without_torch_npu(series):
        newest = newest_release().series
        return f'"torch=={newest}.*" "torch-npu=={newest}.*"'
    return f'"torch-npu=={series}.*"'


def no_release_note(torch_version: Optional[str]) -> str:
    """``" (torch 2.15 has no torch-npu release yet, checked 2026-11-23)"`` for such a torch, else ``""``."""
    series = major_minor(torch_version)
    return f" (torch {series} has no torch-npu release yet, checked {CHECKED})" if without_torch_npu(series) else ""


def cann_matches(found: str, listed: str) -> bool:
    """Whether a CANN version read from the toolkit (``"8.1.RC1"``, ``"9.1.0.beta1"``) is the listed one
    (``"8.1.RC1"``, ``"9.1.0"``, or a family such as ``"9.1.x"``)."""
    found, listed = found.strip().lower(), listed.strip().lower()
    if listed.endswith(".x"):
        listed = listed[:-1]
        return found.startswith(listed)
    return found == listed or found.startswith(listed + ".")


def rows_as_json() -> List[Dict[str, Any]]:
    return [row.as_dict() for row in PAIRINGS]


def markdown_table() -> str:
    """The pairing table the site's error-codes reference shows (docs/hooks/generated.py renders it)."""
    lines = [
        "| torch | torch-npu | CANN |",
        "|---|---|---|",
    ]
    for row in PAIRINGS:
        npu = f"`{row.torch_npu}`" if row.torch_npu else f"none yet (checked {CHECKED})"
        lines.append(f"| `{row.torch}` | {npu} | {row.cann_text} |")
    return "\n".join(lines) + "\n"
