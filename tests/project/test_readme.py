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


def test_the_readme_is_a_landing_page_that_links_each_task_into_the_docs():
    """README.md stays short (at most 150 lines): what npu-port is, the quick start, a task table whose every row
    links into the documentation site by a relative path that exists, and the compatibility table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    section = text.split("## What do you want to do?", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`npu-port " in line]
    assert len(rows) == 5
    for row in rows:
        (link,) = re.findall(r"\]\((docs/[^)#]+\.md)\)", row)
        assert link.startswith(("docs/tutorials/", "docs/how-to/")), row
    missing = sorted(link for link in set(re.findall(r"\]\(([^)#:]+\.md)", text)) if not (ROOT / link).is_file())
    assert missing == []  # links work on GitHub: relative paths to pages that exist
