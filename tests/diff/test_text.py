"""``report_text``: the culprit first, then counts, then the largest divergences — exact lines for built reports."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from npu_port.diff.compare import TOLERANCE, compare_records
from npu_port.diff.text import report_text

from .reports import Records, two_module_report

FIRST = (
    "lin (Linear), step 0, call 0: error 0.1 (tolerance 0.0001, float32), cosine 0.99888 -- origin: its inputs "
    "match (input error 0)"
)
SECOND = (
    "act (ReLU), step 0, call 0: error 0.1 (tolerance 0.0001, float32), cosine 0.99888 -- carried from its inputs "
    "(input error 0.1)"
)


def test_the_culprit_comes_first_then_the_counts_then_the_largest():
    assert report_text(two_module_report()).splitlines() == [
        f"first divergence: {FIRST}",
        "2 of 2 calls diverge (1 as origin); 4 tensors compared",
        "largest divergences (2 of 2):",
        f"  {FIRST}",
        f"  {SECOND}",
    ]


def test_the_report_reads_itself_the_same_way():
    report = two_module_report()
    assert report.text() == report_text(report) and report.text(top=1) == report_text(report, top=1)


def test_top_limits_the_list_and_zero_leaves_it_out():
    assert report_text(two_module_report(), top=1).splitlines()[2:] == ["largest divergences (1 of 2):", f"  {FIRST}"]
    assert len(report_text(two_module_report(), top=0).splitlines()) == 2


def test_no_divergence_says_how_much_was_compared_and_what_was_on_one_side_only():
    a, b = Records(), Records()
    for side in (a, b):
        side.add("lin", "Linear", "in", [1.0, 2.0]).add("lin", "Linear", "out", [3.0, 4.0])
    b.add("extra", "Linear", "out", [1.0])
    a.add("gone", "Linear", "in", [1.0]).add("gone", "Linear", "out", [1.0])
    assert report_text(compare_records(a.items, b.items)).splitlines() == [
        "no divergence beyond tolerance (2 tensors compared)",
        "only in A: 2 tensors (not compared)",
        "only in B: 1 tensor (not compared)",
    ]


def test_nan_appearing_is_named_not_given_a_number():
    a, b = Records(), Records()
    for side, value in ((a, 2.0), (b, math.nan)):
        side.add("norm", "LayerNorm", "in", [1.0, 2.0]).add("norm", "LayerNorm", "out", [1.0, value])
    assert report_text(compare_records(a.items, b.items)).splitlines()[0] == (
        "first divergence: norm (LayerNorm), step 0, call 0: NAN count 0 -> 1 (float32) -- origin: its inputs match "
        "(input error 0)"
    )


def test_an_error_grown_over_ten_times_its_inputs_is_named_as_such():
    a, b = Records(), Records()
    for side, first, last in ((a, 4.0, 4.0), (b, 4.001, 8.0)):
        side.add("lin", "Linear", "in", [1.0, 2.0, 3.0, first]).add("lin", "Linear", "out", [1.0, 2.0, 3.0, last])
    line = report_text(compare_records(a.items, b.items)).splitlines()[0]
    assert line.endswith("-- origin: its error is over 10x its inputs' (input error 0.00025)")


@given(st.floats(min_value=4.0, max_value=100.0, allow_nan=False), st.integers(min_value=1, max_value=3))
def test_the_first_line_names_the_first_divergence_or_says_there_is_none(last, steps):
    report = two_module_report(b_last=last, steps=steps)
    first_line = report_text(report).splitlines()[0]
    first = report.first_divergence
    if first is None:
        assert (last - 4.0) / 4.0 <= 1.01 * TOLERANCE["float32"]
        assert first_line == f"no divergence beyond tolerance ({4 * steps} tensors compared)"
    else:
        assert first_line.startswith(f"first divergence: {first.module} ({first.cls}), step {first.step}, call 0: ")
