"""Origin or carried, by the errors alone: a module whose inputs match is the origin of what its output shows, unless
its inputs were already most of the way to the tolerance and it only took them over it (rounding accumulating, not
a defect); an output error over ``AMPLIFY`` times its inputs' is an origin whatever the inputs."""

from __future__ import annotations

import pytest

from npu_port.diff.compare import AMPLIFY, TOLERANCE, compare_records

from .reports import Records

TOL = TOLERANCE["float32"]


def _call(input_error: float, output_error: float):
    a, b = Records(), Records()
    for side, into, out in ((a, 1.0, 1.0), (b, 1.0 + input_error, 1.0 + output_error)):
        side.add("m", "Linear", "in", [into, -1.0]).add("m", "Linear", "out", [out, -1.0])
    (call,) = compare_records(a.items, b.items).calls
    return call


@pytest.mark.parametrize(
    "input_error, output_error, divergent, origin",
    [
        (0.0, 3 * TOL, True, True),  # inputs identical
        (0.05 * TOL, 3 * TOL, True, True),  # inputs match, clearly
        (0.6 * TOL, 1.2 * TOL, True, False),  # near the tolerance already: carried over it
        (0.6 * TOL, 20 * TOL, True, True),  # amplified over AMPLIFY times
        (3 * TOL, 20 * TOL, True, False),  # divergent inputs, under AMPLIFY times
        (3 * TOL, 40 * TOL, True, True),
        (0.6 * TOL, 0.9 * TOL, False, False),  # within tolerance: neither
    ],
)
def test_origin_by_the_errors(input_error, output_error, divergent, origin):
    call = _call(input_error, output_error)
    assert call.input_error == pytest.approx(input_error, abs=1.2e-7)  # float32 records
    assert (call.divergent, call.origin, call.origin_by) == (divergent, origin, "inputs")
    assert AMPLIFY == 10.0  # the table above is written for it
