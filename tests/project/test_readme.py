"""README's quick start stays true: exactly two commands, torch pinned, and CI runs the very commands shown."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quick_start_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_quick_start_has_exactly_two_one_line_commands_with_torch_pinned():
    commands = _quick_start_commands()
    assert len(commands) == 2
    for command in commands:
        assert "\n" not in command
        assert 'pip install "torch==2.13.0"' in command
    assert commands[0].endswith("python scripts/inference_npu.py")
    assert commands[1].endswith("python -m pytest -n auto")  # every core (pytest-xdist); the whole suite


@pytest.mark.e2e
def test_ci_runs_the_readme_commands_exactly():
    """.ci/run's newest lane runs README's two quick-start commands as README shows them: what its extraction finds
    is each command, and it runs what it found."""
    ci = (ROOT / ".ci" / "run").read_text()
    extract = re.search(r"^quick_start\(\) \{\n.*?^\}$", ci, flags=re.M | re.S).group(0)
    main, tests = _quick_start_commands()
    for kind, expected in (("tests", tests), ("main", main)):
        found = subprocess.run(
            ["bash", "-c", f"{extract}\nquick_start {kind}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert found == expected
    assert 'test_command="$(quick_start tests)"' in ci and 'main_command="$(quick_start main)"' in ci
    assert 'bash -c "$test_command"' in ci and 'bash -c "$main_command"' in ci
