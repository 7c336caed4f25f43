"""The one timing helper (npu_port.device.timing): synchronised runs, warm-up, interleaved rounds, median and quartiles.

The clock is injected (a fake that moves only when the test says so), so nothing here depends on how fast or busy
the machine is; device synchronisation is checked by replacing the backends' ``synchronize``.
"""

from __future__ import annotations

import statistics
from typing import List

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from npu_port.attn import get_kernel
from npu_port.device.timing import Rounds, repeat, rotated, spread, stamp, timed, warm_up


class FakeClock:
    """A clock that reads ``now`` and moves only by :meth:`advance` (whole numbers: exact float arithmetic)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ---- one measurement ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device, backend, passes_device",
    [("cuda", "cuda", True), ("cuda:1", "cuda", True), ("xpu", "xpu", True), ("mps", "mps", False)],
)
def test_timed_synchronises_the_device_it_times_before_and_after_the_work(monkeypatch, device, backend, passes_device):
    events: List[tuple] = []
    clock = FakeClock()

    def synchronize(*args):
        events.append(("sync", *args))

    monkeypatch.setattr(getattr(torch, backend), "synchronize", synchronize)
    for other in {"cuda", "xpu", "mps"} - {backend}:  # a sync of another backend would be a bug
        monkeypatch.setattr(getattr(torch, other), "synchronize", lambda *a, name=other: events.append(("wrong", name)))

    def work():
        events.append(("work",))
        clock.advance(7.0)
        return "out"

    out, seconds = timed(work, device, clock=clock)
    expected_sync = ("sync", torch.device(device)) if passes_device else ("sync",)
    assert (out, seconds) == ("out", 7.0)
    assert events == [expected_sync, ("work",), expected_sync]
    assert clock.reads == 2


def test_on_the_cpu_nothing_is_synchronised_and_the_time_is_the_clocks(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cpu, "synchronize", lambda *a: calls.append(a))
    clock = FakeClock()
    clock.advance(3.0)
    assert stamp("cpu", clock) == 3.0
    assert timed(lambda: clock.advance(2.5), "cpu", clock=clock) == (None, 2.5)
    assert timed(lambda: 1, None, clock=clock) == (1, 0.0)  # None is the cpu
    assert calls == []


def test_warm_up_runs_untimed_then_waits_for_the_device(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    warm_up(lambda: events.append("run"), "cuda", times=3)
    assert events == ["run", "run", "run", "sync"]


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=25), st.integers(0, 4))
def test_repeat_records_only_the_timed_runs_after_the_warm_up(durations, warmup):
    clock = FakeClock()
    script = [10**7] * warmup + list(durations)  # warm-up runs take far longer: any of them recorded would show
    ran = []

    def work():
        ran.append(clock.now)
        clock.advance(script[len(ran) - 1])

    samples = repeat(work, "cpu", len(durations), warmup=warmup, clock=clock)
    assert samples == [float(d) for d in durations]
    assert len(ran) == warmup + len(durations)
    assert clock.reads == 2 * len(durations)  # the warm-up reads no clock


# ---- median and middle half ---------------------------------------------------------------------------------------


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=40))
def test_spread_is_the_median_and_the_inclusive_quartiles_of_the_runs(durations):
    clock = FakeClock()
    left = list(durations)
    samples = repeat(lambda: clock.advance(left.pop(0)), "cpu", len(durations), warmup=0, clock=clock)
    summary = spread(samples)
    assert summary.median == statistics.median(durations)
    assert summary.runs == len(durations)
    if len(durations) > 1:
        low, _, high = statistics.quantiles(durations, n=4, method="inclusive")
        assert (summary.low, summary.high) == (low, high)
    else:
        assert summary.low == summary.high == durations[0]
    assert min(durations) <= summary.low <= summary.median <= summary.high <= max(durations)


def test_one_outlier_moves_the_middle_half_only_to_a_neighbouring_run():
    summary = spread([1.0, 1.01, 60.0, 0.99, 1.0])  # one run 60 times slower
    assert (summary.low, summary.median, summary.high, summary.runs) == (1.0, 1.0, 1.01, 5)


def test_spread_of_no_runs_is_an_error_not_a_number():
    with pytest.raises(ValueError, match="^no timed runs to summarise$"):
        spread([])


# ---- interleaved rounds -------------------------------------------------------------------------------------------


def test_rotated_starts_each_round_one_candidate_later():
    assert [rotated("abc", i) for i in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert rotated([], 3) == []


def test_rounds_interleave_every_candidate_once_per_round_in_a_rotated_order():
    calls = []
    rounds = Rounds(["a", "b", "c"], lambda name: calls.append(name) or 1.0)
    assert rounds.run(4) == 4
    assert calls == list("abcbcacababc")
    assert rounds.samples == [[1.0] * 4] * 3


def test_warm_up_rounds_are_run_in_the_rotation_but_not_recorded():
    calls = []
    seconds = iter(range(1, 100))

    def time_one(name):
        calls.append(name)
        return float(next(seconds))

    rounds = Rounds(["a", "b"], time_one)
    assert rounds.run(2, untimed=1) == 3
    assert calls == list("abbaab")
    assert rounds.samples == [[4.0, 5.0], [3.0, 6.0]]  # a's and b's warm-up runs (1 and 2 s) are not there


def test_a_second_run_continues_the_rotation_and_the_samples():
    calls = []
    rounds = Rounds(["a", "b", "c"], lambda name: calls.append(name) or 2.0)
    rounds.run(2)
    rounds.run(2)
    assert calls == list("abcbcacababc")
    assert [len(s) for s in rounds.samples] == [4, 4, 4]
    assert rounds.spreads()[0].median == 2.0


def test_samples_go_into_the_callers_lists_as_they_are_taken_so_ctrl_c_keeps_them():
    mine = [[], []]
    count = iter(range(100))

    def time_one(name):
        if next(count) == 3:
            raise KeyboardInterrupt
        return 1.5

    rounds = Rounds(["a", "b"], time_one, samples=mine)
    with pytest.raises(KeyboardInterrupt):
        rounds.run(5)
    assert mine == [[1.5], [1.5, 1.5]]  # round 0: a, b; round 1: b, then a is interrupted
    assert rounds.samples[0] is mine[0] and rounds.samples[1] is mine[1]


def test_a_candidate_that_fails_is_reported_once_and_drops_out_of_the_rotation():
    calls, failures = [], []

    def time_one(name):
        calls.append(name)
        if name == "b" and len(calls) > 3:
            raise RuntimeError("device lost")
        return 1.0

    rounds = Rounds(
        ["a", "b", "c"], time_one, on_error=lambda name, exc, index: failures.append((name, str(exc), index))
    )
    rounds.run(3)
    assert failures == [("b", "device lost", 1)]
    assert calls == list("abcbca") + list("ac")  # round 1 fails b first; round 2 rotates over a, c
    assert rounds.samples == [[1.0] * 3, [1.0], [1.0] * 3]
    assert [s.runs if s else 0 for s in rounds.spreads()] == [3, 1, 3]


def test_without_an_error_handler_a_failing_run_propagates():
    rounds = Rounds(["a"], lambda name: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        rounds.run(1)


def test_a_round_starts_only_if_it_is_expected_to_end_before_the_deadline():
    clock = FakeClock()

    def time_one(name):
        clock.advance(1.0)
        return 1.0

    rounds = Rounds(["a", "b"], time_one, clock=clock)
    # round 0 is planned at 3 s (ends by 3 <= 5.5), then each round is expected to take 2 s as the last did:
    # round 1 starts at 2 (ends by 4), round 2 would start at 4 and end by 6 > 5.5: not started
    assert rounds.run(10, deadline=5.5, first_round_s=3.0) == 2
    assert clock.now == 4.0 and rounds.samples == [[1.0, 1.0], [1.0, 1.0]]
    assert rounds.run(10, deadline=5.5) == 0  # the plan carries over to a later run


def test_a_first_round_planned_past_the_deadline_runs_nothing():
    clock = FakeClock()
    rounds = Rounds(["a", "b"], lambda name: pytest.fail("ran past the budget"), clock=clock)
    assert rounds.run(3, untimed=1, deadline=10.0, first_round_s=10.5) == 0
    assert rounds.samples == [[], []] and rounds.spreads() == [None, None]


def test_samples_must_match_the_candidates():
    with pytest.raises(ValueError, match="^1 sample lists for 2 candidates$"):
        Rounds(["a", "b"], lambda name: 1.0, samples=[[]])


def test_after_round_is_told_each_round_and_how_many_candidates_started_it():
    seen = []
    rounds = Rounds(["a", "b", "c"], lambda name: 1.0 if name != "c" else 1 / 0, on_error=lambda *a: None)
    rounds.run(3, after_round=lambda index, started: seen.append((index, started)))
    assert seen == [(0, 3), (1, 2), (2, 2)]


# ---- auto uses it -------------------------------------------------------------------------------------------------


def test_auto_times_its_candidates_in_rotated_rounds_and_records_only_the_timed_ones(monkeypatch):
    from npu_port.attn.call import AttentionCall
    from npu_port.strategy import measure as measure_module
    from npu_port.strategy.decision import bucket_key

    gen = torch.Generator().manual_seed(0)
    call = AttentionCall.from_arguments(*(torch.randn(1, 2, 12, 8, generator=gen) for _ in range(3)))
    order: List[str] = []
    real = measure_module._time_once

    def scripted(kernel, call):
        out, _ = real(kernel, call)
        order.append(kernel.name)
        runs = order.count(kernel.name)
        return out, 1.0 if runs <= 2 else 1e-3 * runs  # first run and the warm-up round: 1 s, never recorded

    monkeypatch.setattr(measure_module, "_time_once", scripted)
    names = ["sdpa", "math", "chunked"]
    decision = measure_module.measure(
        call,
        bucket_key(call),
        [get_kernel(name) for name in names],
        budget_bytes=None,
        warmup=2,
        repeats=3,
        probe_seconds=600.0,
        parity_rows=8,
    )
    first_runs, rounds = order[:3], [order[i : i + 3] for i in range(3, len(order), 3)]
    assert first_runs == names
    assert rounds == [rotated(names, i) for i in range(4)]  # one untimed round, then three timed ones
    expected = spread([1e-3 * 3, 1e-3 * 4, 1e-3 * 5])
    for candidate in decision.candidates:
        assert (candidate.runs, candidate.low_s, candidate.median_s, candidate.high_s) == (
            3,
            expected.low,
            expected.median,
            expected.high,
        )
