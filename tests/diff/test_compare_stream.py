"""compare_records streams side B alongside side A: the same report whatever B's order, and nothing held when both
come in the same order (two runs of the same code)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.diff.compare import RecordMatcher, compare_records, record_key
from npu_port.diff.stats import tensor_stats


def run_records(modules: int, steps: int, seed: int, wrong: int = -1):
    """Records as capture writes them: per step, each module's input then output (inner modules finish first)."""
    generator = torch.Generator().manual_seed(seed)
    records = []
    for step in range(steps):
        for number in range(modules):
            for io in ("in", "out"):
                tensor = torch.randn(3, 5, generator=generator, dtype=torch.float64).float()
                if io == "out" and number == wrong:
                    tensor = tensor * 1.01
                record = {"kind": "module", "module": f"m{number}", "class": "Linear", "step": step, "call": 0}
                record.update(io=io, index=0, name="args[0]" if io == "in" else "out", device="cpu")
                record.update(tensor_stats(tensor), seq=len(records))
                records.append(record)
    return records


def report(a, b):
    return compare_records(a, b).as_dict()


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(-1, 4),
    st.randoms(use_true_random=False),
    st.integers(0, 3),
    st.integers(0, 3),
)
def test_the_report_does_not_depend_on_the_order_of_side_b(modules, steps, wrong, rng, drop_a, drop_b):
    a = run_records(modules, steps, seed=0)
    b = run_records(modules, steps, seed=0, wrong=wrong)
    for _ in range(min(drop_a, len(a) - 1)):  # records one side lacks
        a.pop(rng.randrange(len(a)))
    for _ in range(min(drop_b, len(b) - 1)):
        b.pop(rng.randrange(len(b)))
    position = {record_key(r): i for i, r in enumerate(a)}
    in_a_order = sorted(b, key=lambda r: position.get(record_key(r), len(a)))
    shuffled = list(b)
    rng.shuffle(shuffled)
    expected = report(a, in_a_order)
    assert report(a, shuffled) == expected
    assert expected["only_in_a"] == len(set(position) - {record_key(r) for r in b})
    assert expected["only_in_b"] == len({record_key(r) for r in b} - set(position))
    assert expected["records_compared"] == len(set(position) & {record_key(r) for r in b})
    if 0 <= wrong < modules and drop_a == drop_b == 0:
        assert expected["first_divergence"]["module"] == f"m{wrong}"


def test_the_same_order_holds_nothing_and_one_swap_holds_one():
    a = run_records(4, 2, seed=1)
    b = run_records(4, 2, seed=1, wrong=2)
    matcher = RecordMatcher(iter(b))
    assert all(matcher.take(record_key(r)) is other for r, other in zip(a, b))
    assert matcher.peak == 0 and matcher.unmatched() == 0
    swapped = list(b)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    matcher = RecordMatcher(iter(swapped))
    assert [matcher.take(record_key(r)) for r in a] == b
    assert matcher.peak == 1 and matcher.unmatched() == 0
    assert report(a, swapped) == report(a, b)
    missing = RecordMatcher(iter(b))
    assert missing.take(("module", "nowhere", 0, 0, "out", 0)) is None and missing.peak == len(b)
    assert missing.take(record_key(b[5])) is b[5] and missing.unmatched() == len(b) - 1
