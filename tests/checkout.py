"""The guard against testing another tree: the suite must import the ``npu_port`` of the checkout it lives in.

With an editable install, ``npu_port`` — and above all ``npu_port.strategies``, which setup.cfg maps from the
top-level ``strategies/`` folder — resolve to whichever checkout was installed. Run from a second checkout or a git
worktree, the tests would silently exercise the other tree's strategy files (or its whole package). ``conftest.py``
calls :func:`checkout_problems` at start-up and stops the run at once, saying what resolved where.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]


def checkout_problems(root: Path, package_dir: Path, strategies_dir: Path) -> List[str]:
    """What resolves outside ``root``: the imported package, the built-in strategy folder."""
    problems = []
    if package_dir.resolve() != (root / "npu_port").resolve():
        problems.append(f"npu_port is imported from {package_dir}")
    if strategies_dir.resolve() != (root / "strategies").resolve():
        problems.append(f"npu_port.strategies (the built-in strategy files) resolves to {strategies_dir}")
    return problems


def guard_message(root: Path, problems: List[str]) -> str:
    return (
        f"the tests in {root} would test another tree: {'; '.join(problems)}. An installed (editable) npu-port of "
        f"another checkout answers for this one. Install this checkout into the environment first "
        f'(pip install -e "{root}[dev]"), or use an environment of its own.'
    )
