"""The suite refuses to run against another checkout's package or strategy files (tests/checkout.py)."""

from __future__ import annotations

from pathlib import Path

import npu_port
from npu_port.strategy.loader import builtin_dirs

from ..checkout import ROOT, checkout_problems, guard_message


def test_this_run_imports_this_checkout():
    assert checkout_problems(ROOT, Path(npu_port.__file__).parent, builtin_dirs()[0]) == []


def test_another_trees_package_or_strategy_files_are_named(tmp_path):
    other = tmp_path / "other"
    problems = checkout_problems(ROOT, other / "npu_port", other / "strategies")
    assert problems == [
        f"npu_port is imported from {other / 'npu_port'}",
        f"npu_port.strategies (the built-in strategy files) resolves to {other / 'strategies'}",
    ]
    assert checkout_problems(ROOT, ROOT / "npu_port", other / "strategies") == problems[1:]  # the worktree case
    message = guard_message(ROOT, problems[1:])
    assert message.startswith(f"the tests in {ROOT} would test another tree: npu_port.strategies")
    assert f'pip install -e "{ROOT}[dev]"' in message
