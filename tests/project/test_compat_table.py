"""The CI lanes' record and README's compatibility table stay true: the record (``npu_port/support_tested.json``,
written by ``.ci/run``) is well-formed and names exactly the lanes ``.ci/run`` runs, README's table is exactly what
the record renders, and the oldest lanes pin the minimums ``npu_port/support.py`` claims. The record's logic
(``.ci/lanes/record.py``) is tested here on records and JUnit reports made for the purpose."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest

from npu_port import support

ROOT = Path(__file__).resolve().parents[2]


def _load_record_module():
    spec = importlib.util.spec_from_file_location("ci_record", ROOT / ".ci" / "lanes" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record = _load_record_module()


def _lane_data():
    """``LANES`` and ``PINNED_FROM`` of .ci/lanes/lanes.sh (plain bash assignments, one entry a line)."""
    text = (ROOT / ".ci" / "lanes" / "lanes.sh").read_text(encoding="utf-8")
    lanes = re.search(r"^LANES=\((.*)\)$", text, flags=re.M).group(1).split()
    block = re.search(r"^declare -A PINNED_FROM=\($(.*?)^\)$", text, flags=re.M | re.S).group(1)
    return lanes, dict(re.findall(r'^\s*\[([^\]]+)\]="([^"]*)"$', block, flags=re.M))


def _tested():
    return json.loads(support.TESTED_FILE.read_text(encoding="utf-8"))


# ---- the repository's record and table ----------------------------------------------------------------------------


def test_the_record_is_where_support_reads_it_and_well_formed():
    assert record.RECORD == support.TESTED_FILE
    data = _tested()
    assert record.problems(data) == []
    assert support.tested() == data


def test_the_record_names_exactly_the_lanes_ci_runs_in_order_each_with_its_constraints():
    lanes, _ = _lane_data()
    data = _tested()
    assert [lane["lane"] for lane in data["lanes"]] == lanes
    for lane in data["lanes"]:
        if lane["lane"] == "newest":
            assert lane["constraints"] is None  # resolved afresh: nothing pins it
        else:
            assert lane["constraints"] == f".ci/constraints/{lane['lane']}.txt"
            assert (ROOT / lane["constraints"]).is_file()


def test_readme_shows_exactly_the_table_the_record_renders():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert record.block_in(readme) == record.render_table(_tested()), (
        "README's compatibility table is not what npu_port/support_tested.json says: run .ci/run (or "
        ".ci/lanes/record.py merge) instead of editing it"
    )


def test_each_constraints_file_pins_every_package_it_was_resolved_from():
    _, pinned_from = _lane_data()
    for lane, wanted in pinned_from.items():
        pins = record.pins((ROOT / ".ci" / "constraints" / f"{lane}.txt").read_text(encoding="utf-8"))
        assert pins.get("torch") == "2.13.0", lane
        for requirement in wanted.split():
            name, _, version = requirement.partition("==")
            assert pins.get(record._canonical(name)) == version, f"{lane}: {requirement} is not what it pins"


def test_the_oldest_lanes_pin_the_minimums_and_the_modern_minimums_the_policy_claims():
    """support.py's numbers are what the lanes test: each library's minimum is pinned by an oldest lane, and so is
    each feature's (the oldest release its modern path is claimed on)."""
    pinned = {}
    for path in (ROOT / ".ci" / "constraints").glob("oldest-*.txt"):
        for name, version in record.pins(path.read_text(encoding="utf-8")).items():
            pinned.setdefault(name, set()).add(version)
    for package in ("diffusers", "transformers", "huggingface_hub", "accelerate"):
        entry = support.supported(package)
        assert entry.minimum in pinned.get(record._canonical(package), set()), (
            f"no oldest lane pins {package}=={entry.minimum}"
        )
        for feature, version in entry.features.items():
            if feature.startswith(("legacy attention", "attention processors", "Attention modules")):
                continue  # diffusers' own layouts, each covered by the 0.11.1 / 0.14.0 lanes and the newest
            assert version in pinned.get(record._canonical(package), set()), (
                f"no oldest lane pins {package}=={version} ({feature})"
            )


# ---- record.py's logic ---------------------------------------------------------------------------------------------

#: pytest's JUnit report (junit_family=xunit1) of a run with a pass, a failure, a class's skip and failure, a setup
#: error — and, from a second run, a module that could not be collected.
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1"
failures="2" skipped="1" tests="5" time="0.488">
<testcase classname="tests.test_s" name="test_ok" file="tests/test_s.py" line="1" time="0.001" />
<testcase classname="tests.test_s" name="test_bad[2]" file="tests/test_s.py" line="2" time="0.001"><failure
 message="AssertionError: x is not one&#10;  second line&#10;assert 2 == 1">x = 2</failure></testcase>
<testcase classname="tests.test_s.TestK" name="test_skip" file="tests/test_s.py" line="5" time="0.001"><skipped
 type="pytest.skip" message="not here">/tmp/jx/tests/test_s.py:6: not here</skipped></testcase>
<testcase classname="tests.test_s.TestK" name="test_err" file="tests/test_s.py" line="6" time="0.001"><failure
 message="RuntimeError: boom">self = x</failure></testcase>
<testcase classname="tests.test_s" name="test_setup_error" file="tests/test_s.py" line="9" time="0.001"><error
 message="failed on setup with &quot;OSError: fixture broke&quot;">@pytest.fixture</error></testcase>
</testsuite></testsuites>"""
COLLECTION_ERROR = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
errors="1" failures="0" skipped="0" tests="1" time="1.7"><testcase classname="" name="tests.test_collect"
file="tests/test_collect.py" time="0.000"><error message="collection failure">ImportError while importing test module
Traceback:
tests/test_collect.py:1: in &lt;module&gt;
    import nonexistent_mod
E   ModuleNotFoundError: No module named 'nonexistent_mod'</error></testcase></testsuite></testsuites>"""


def test_junit_results_count_every_outcome_and_name_each_failure_with_its_cause(tmp_path):
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text(COLLECTION_ERROR)
    found = record.junit_results([tmp_path / "a.xml", tmp_path / "b.xml", tmp_path / "never-written.xml"])
    assert found["counts"] == {"passed": 1, "failed": 2, "errors": 2, "skipped": 1}
    assert found["failures"] == [
        {"test": "tests/test_s.py::test_bad[2]", "cause": "AssertionError: x is not one"},
        {"test": "tests/test_s.py::TestK::test_err", "cause": "RuntimeError: boom"},
        {"test": "tests/test_s.py::test_setup_error", "cause": 'failed on setup with "OSError: fixture broke"'},
        {"test": "tests/test_collect.py", "cause": "ModuleNotFoundError: No module named 'nonexistent_mod'"},
    ]


def _result(name, *, failed=0, steps=(("tests", 0),), passed=10):
    counts = {"passed": passed, "failed": failed, "errors": 0, "skipped": 1}
    junit = {"counts": counts, "failures": [{"test": f"t{i}", "cause": "x"} for i in range(failed)]}
    versions = {"python": "3.11.7", "torch": "2.13.0+cpu", "diffusers": "0.14.0", "transformers": "4.30.2"}
    versions.update(huggingface_hub="0.25.2", accelerate=None, gradio=None)
    return record.lane_result(
        name, about=f"about {name}", tests="some tests", constraints=None, versions=versions, steps=steps,
        junit=junit, seconds=61.4, date="2026-11-27",
    )  # fmt: skip


def test_a_lane_passes_only_with_every_step_ok_tests_run_and_none_failed():
    assert _result("a")["outcome"] == "pass"
    assert _result("a", failed=1)["outcome"] == "fail"
    assert _result("a", steps=(("install", 0), ("tests", 1)))["outcome"] == "fail"
    no_tests = record.lane_result(
        "a", about="x", tests="x", constraints=None, versions={}, steps=[("tests", 0)],
        junit={"counts": dict.fromkeys(record.COUNTS, 0), "failures": []}, seconds=1, date="2026-11-27",
    )  # fmt: skip
    assert no_tests["outcome"] == "fail"  # a lane that ran no test has shown nothing


def test_problems_name_each_malformed_part_of_a_record():
    good = {"schema": record.SCHEMA, "lanes": [_result("a"), _result("b", failed=2)]}
    assert record.problems(good) == []
    cases = {
        "the record is a list, not an object": [],
        "lanes must be a non-empty list": {"schema": record.SCHEMA, "lanes": []},
    }
    for expected, bad in cases.items():
        assert expected in record.problems(bad)

    def broken(change):
        bad = copy.deepcopy(good)
        change(bad["lanes"][0])
        return record.problems(bad)

    assert broken(lambda lane: lane.update(date="27/11/2026")) == [
        "lane 'a': date must be YYYY-MM-DD, got '27/11/2026'"
    ]
    assert broken(lambda lane: lane.update(outcome="ok")) == [
        "lane 'a': outcome must be one of ('pass', 'fail'), got 'ok'"
    ]
    assert broken(lambda lane: lane["versions"].pop("gradio")) == [
        "lane 'a': versions must name python and each of torch, diffusers, transformers, huggingface_hub, "
        "accelerate, gradio (null if absent)"
    ]
    assert broken(lambda lane: lane["counts"].update(failed=1)) == [
        "lane 'a': failures must list every failed test and error",
        "lane 'a': outcome pass with {'passed': 10, 'failed': 1, 'errors': 0, 'skipped': 1}",
    ]
    assert broken(lambda lane: lane["steps"][0].update(exit=1)) == ["lane 'a': outcome pass with a failed step"]
    assert broken(lambda lane: lane.update(lane="b")) == ["lanes[1]: lane 'b' appears twice"]
    bad = copy.deepcopy(good)
    bad["schema"] = 0
    assert record.problems(bad) == [f"schema is 0, expected {record.SCHEMA}"]


def test_merge_takes_this_runs_results_keeps_the_others_and_drops_lanes_gone():
    old = {"schema": 1, "lanes": [_result("a"), _result("b"), _result("gone")], "run": {"date": "2026-11-01"}}
    new_a = _result("a", failed=1)
    merged = record.merge(old, [new_a], ["a", "b", "c"])
    assert merged["lanes"] == [new_a, old["lanes"][1]]  # c has never run: absent until it does
    assert merged["run"] == {"date": "2026-11-01"}  # a partial run keeps the last complete run's summary
    run = {"date": "2026-11-27", "seconds": 1500, "cores": 2, "fresh": True}
    assert record.merge(old, [new_a], ["a"], run)["run"] == run
    with pytest.raises(ValueError, match="results for lanes .ci/run does not define: x"):
        record.merge(old, [_result("x")], ["a"])


def test_the_table_renders_versions_outcomes_counts_and_the_run():
    data = {
        "schema": 1,
        "lanes": [_result("oldest-0.14"), _result("newest", failed=2, steps=(("README test command", 1),))],
        "run": {"date": "2026-11-27", "seconds": 1500, "cores": 2, "fresh": True},
    }
    table = record.render_table(data).splitlines()
    assert table[0] == (
        "| lane | tests | torch | diffusers | transformers | huggingface_hub | accelerate | gradio | result | time | date |"
    )
    assert table[2] == (
        "| `oldest-0.14` | some tests | 2.13.0+cpu | 0.14.0 | 4.30.2 | 0.25.2 | — | — | ✔ pass: 10 passed, 1 skipped "
        "| 1 min 1 s | 2026-11-27 |"
    )
    assert "✘ fail: 10 passed, 2 failed, 1 skipped" in table[3]
    assert table[-1] == "The last `.ci/run` of every lane took 25 min 0 s on 2026-11-27 (2 cores, from empty caches)."


def test_replace_block_rewrites_only_between_the_markers_and_refuses_a_readme_without_them():
    text = f"intro\n{record.START}\nold table\n{record.END}\noutro\n"
    replaced = record.replace_block(text, "new table")
    assert replaced == f"intro\n{record.START}\nnew table\n{record.END}\noutro\n"
    assert record.block_in(replaced) == "new table"
    for bad in ("no markers", f"{record.END}\n{record.START}", f"{record.START}{record.START}{record.END}"):
        with pytest.raises(ValueError, match="README.md must hold"):
            record.replace_block(bad, "x")


def test_unpinned_names_installed_packages_the_constraints_do_not_pin_exactly():
    constraints = "# header\ntorch==2.13.0\nDiffusers==0.14.0  # old\nhuggingface-hub==0.25.2\nnumpy>=1\n"
    installed = {"torch": "2.13.0", "diffusers": "0.14.0", "huggingface_hub": "0.25.2", "numpy": "2.4.6"}
    installed.update({"pip": "23.2.1", "npu-port": "0.1.0", "Pillow": "13.0.0"})
    assert record.unpinned(installed, constraints) == ["numpy==2.4.6", "pillow==13.0.0"]


def test_the_summary_prints_each_lane_its_failures_and_a_total_line():
    results = [_result("locked"), _result("newest", failed=1, steps=(("README test command", 1),))]
    lines = record.summary(results, {"newest": [{"test": "tests/x.py::test_y", "cause": "AttributeError: z"}]})
    assert lines[0].startswith("lane locked: PASS — 10 passed, 1 skipped (some tests; tests ok; ")
    assert lines[1].startswith("lane newest: FAIL — 10 passed, 1 failed, 1 skipped (some tests; README test command")
    assert lines[2] == "    tests/x.py::test_y: AttributeError: z"
    assert re.fullmatch(r"ci: 20 passed, 1 failed, 2 skipped", lines[-1])


def test_the_docs_versions_table_states_the_policy():
    """The "What is supported" table of docs/explanation/versions.md says what ``npu_port/support.py`` says: each
    library's minimum, and every feature's version in that library's row."""
    text = (ROOT / "docs" / "explanation" / "versions.md").read_text(encoding="utf-8")
    section = text.split("## What is supported", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in support.BY_PACKAGE:
            rows[cells[0]] = cells
    assert sorted(rows) == sorted(support.BY_PACKAGE)
    for package, entry in support.BY_PACKAGE.items():
        _, since, features = rows[package]
        assert since.split()[0] == entry.minimum, package
        for feature, version in entry.features.items():
            assert version in features, f"{package}: {feature} from {version} is not in the docs' row: {features}"
