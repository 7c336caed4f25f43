"""``tensor_stats``' two ways to the same summary: the host fast path for tensors without NaN/inf, and the general
one (used on devices and when NaN or inf are present) — the same numbers, against a float64 reference."""

from __future__ import annotations

import math

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from npu_port.diff import stats


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32), min_size=1, max_size=300),
    st.sampled_from([None, math.nan, math.inf, -math.inf]),
)
def test_the_summary_matches_a_float64_reference_whatever_the_path(values, odd):
    tensor = torch.tensor(values + ([odd] if odd is not None else []), dtype=torch.float32)
    record = stats.tensor_stats(tensor)
    reference = torch.tensor(values, dtype=torch.float64)
    scale = float(reference.abs().max()) or 1.0
    assert record["min"] == float(reference.min()) and record["max"] == float(reference.max())
    assert math.isclose(record["mean"], float(reference.mean()), rel_tol=0, abs_tol=1e-6 * scale)
    want_std = float(reference.std()) if len(values) > 1 else 0.0
    assert math.isclose(record["std"], want_std, rel_tol=1e-5, abs_tol=1e-6 * scale)
    assert record["nan"] == (1 if odd is not None and math.isnan(odd) else 0)
    assert record["inf"] == (1 if odd is not None and math.isinf(odd) else 0)


@given(st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32), min_size=1, max_size=300))
@example(values=[0.0, 1.401298464324817e-45])  # subnormal: the paths' means differ by one subnormal step
def test_both_paths_agree_on_finite_tensors(values):
    tensor = torch.tensor(values, dtype=torch.float32)
    fast = stats._all_finite(tensor, float(tensor.sum()))
    general = stats._with_nonfinite(tensor)
    scale = max(abs(v) for v in values) or 1.0
    floor = torch.finfo(torch.float32).tiny  # below it float32 is subnormal: the two paths may round 1e-45 apart
    for got, want in zip(fast, general):
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=max(1e-5 * scale, floor))
