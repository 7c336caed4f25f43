"""Every rule against fixtures of ours that say, inline, what they expect: ``# expect: NPU301`` (or several codes,
comma-separated) on each line a finding must start on; every other line must give none. A rule without a fixture that
expects it fails here, so a new rule comes with its fixture."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npu_port.scan.engine import scan_file, select_rules
from npu_port.scan.rule import rules

FIXTURES = Path(__file__).parent / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9,\s]+?)\s*$")


def _fixtures():
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file())


def expected(path: Path):
    found = set()
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        match = EXPECT.search(line)
        if match:
            found |= {(number, code.strip()) for code in match.group(1).split(",") if code.strip()}
    return found


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_the_fixture_gives_exactly_the_findings_it_expects(path):
    result = scan_file(str(path), False, select_rules())
    got = {(f.line, f.code) for f in result.findings}
    assert got == expected(path), "\n".join(f"{f.line}: {f.code} {f.message}" for f in result.findings)


def test_every_rule_has_a_fixture_that_expects_it():
    covered = {code for path in _fixtures() for _, code in expected(path)}
    missing = [r.code for r in rules() if r.code not in covered]
    assert missing == []


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_triggers_only_skip_files_a_rule_would_find_nothing_in(path, monkeypatch):
    """A rule's triggers decide which files it reads, for speed: reading every file with every rule must find the
    same (a trigger that misses a form, `nn.Softmax` for `softmax`, drops findings)."""
    import npu_port.scan.engine as engine
    from npu_port.scan.rules.npu001_unreadable import SyntaxRule

    selected = select_rules()
    with_triggers = scan_file(str(path), False, selected).findings
    monkeypatch.setattr(
        engine,
        "_interested",
        lambda rules, text, python: [r for r in rules if r is not SyntaxRule and bool(r.file_patterns) != python],
    )
    assert scan_file(str(path), False, selected).findings == with_triggers
