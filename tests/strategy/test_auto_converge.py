"""Provisional picks converge: each process that finds one measures it more, pooling its runs with the stored ones,
and once the runs of MIN_CONFIDENT_RUNS measurements are pooled the pick is settled — the bucket stops being
measured and the kernel mix stops changing from run to run, however noisy the machine. Processes are simulated by
fresh routers on one cache folder; the noise is a seeded random clock standing in for auto's (``_time_once``)."""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
from collections import Counter
from typing import Dict, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_port.strategy import measure as measure_module
from npu_port.strategy.decision import OK, PICKED, SKIPPED, CandidateResult, Decision, all_runs
from npu_port.strategy.measure import MIN_CONFIDENT_RUNS, conclude, pick, pool
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter
from npu_port.strategy.spec import DEFAULT_OPTIONS

REPEATS, MARGIN = DEFAULT_OPTIONS["repeats"], DEFAULT_OPTIONS["margin"]
SHAPES = (12, 20, 28)  # three buckets per process


@contextlib.contextmanager
def noisy_clock(rng: random.Random, base: Dict[str, float], noise: float):
    """auto's clock reporting ``base`` seconds per kernel times a random factor in [1, 1 + noise]."""
    real = measure_module._time_once

    def fake(kernel, call):
        return real(kernel, call)[0], base[kernel.name] * rng.uniform(1.0, 1.0 + noise)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_module, "_time_once", fake)
        yield


@contextlib.contextmanager
def cache_folder():
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        patch.setenv("NPU_PORT_CACHE_DIR", folder)
        yield folder


def one_process(rng: random.Random, base: Dict[str, float], noise: float) -> StrategyRouter:
    router = StrategyRouter(get_strategy("auto").with_overrides(candidates=["sdpa", "math"], probe_seconds=60.0))
    with noisy_clock(rng, base, noise):
        for s in SHAPES:
            q = torch.randn(1, 2, s, 8, generator=torch.Generator().manual_seed(s))
            router(q, q, q)
    return router


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    math_base=st.floats(0.6, 1.4),
    noise=st.sampled_from([0.05, 0.6, 3.0]),
)
def test_the_kernel_mix_settles_within_min_confident_runs_processes_and_never_changes_after(seed, math_base, noise):
    rng = random.Random(seed)
    base = {"sdpa": 1e-3, "math": math_base * 1e-3}
    with cache_folder():
        routers = [one_process(rng, base, noise) for _ in range(MIN_CONFIDENT_RUNS + 3)]
    for index, router in enumerate(routers):
        if index >= MIN_CONFIDENT_RUNS:  # settled by then: loaded, nothing measured
            assert router.probes == 0
        for decision in router.decisions.values():
            if decision.source == "measured":  # every process before this one measured it too: all runs pooled
                assert len(decision.measurements) == index + 1
                if index + 1 >= MIN_CONFIDENT_RUNS:
                    assert not decision.provisional
            else:
                assert decision.source == "disk cache" and not decision.provisional
    mixes = [Counter(d.kernel for d in router.decisions.values()) for router in routers]
    assert all(mix == mixes[MIN_CONFIDENT_RUNS - 1] for mix in mixes[MIN_CONFIDENT_RUNS - 1 :]), mixes


NOISY = {  # math's median 20% below sdpa's (more than the 10% margin), but their middle halves overlap
    "sdpa": [1.00, 1.00, 0.90, 0.95, 1.00, 1.10, 1.20],  # first run, untimed round, then the 5 timed rounds (ms)
    "math": [0.80, 0.80, 0.60, 0.70, 0.80, 1.05, 1.10],
}


@contextlib.contextmanager
def noisy_the_same_way_every_time():
    real = measure_module._time_once
    turn: Counter = Counter()

    def fake(kernel, call):
        script = NOISY[kernel.name]
        seconds = script[turn[kernel.name] % len(script)] * 1e-3
        turn[kernel.name] += 1
        return real(kernel, call)[0], seconds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_module, "_time_once", fake)
        yield


def test_a_provisional_pick_is_measured_more_until_the_pooled_runs_settle_it():
    """Noise that hides the answer from every measurement, the same in each process: each adds its 5 runs (the
    stored ones are kept, not measured again from scratch); the third settles the pick on 15 runs per candidate,
    and the fourth measures nothing. No process says anything: the details are in explain()."""
    seen: List[Decision] = []
    with cache_folder():
        for _ in range(MIN_CONFIDENT_RUNS + 1):
            router = StrategyRouter(get_strategy("auto").with_overrides(candidates=["sdpa", "math"]))
            q = torch.randn(1, 2, 12, 8, generator=torch.Generator().manual_seed(0))
            with noisy_the_same_way_every_time():
                router(q, q, q)
            (decision,) = router.decisions.values()
            seen.append(decision)
    for index, decision in enumerate(seen[:MIN_CONFIDENT_RUNS]):
        assert decision.source == "measured" and len(decision.measurements) == index + 1
        if index:
            assert decision.measurements[:index] == seen[index - 1].measurements
        for candidate in decision.candidates:
            runs = all_runs(candidate.samples)
            assert runs == [t * 1e-3 for t in NOISY[candidate.kernel][2:]] * (index + 1)
            assert (candidate.runs, candidate.median_s) == (len(runs), statistics.median(runs))
    assert [d.provisional for d in seen] == [True] * (MIN_CONFIDENT_RUNS - 1) + [False, False]
    assert [d.kernel for d in seen] == ["sdpa"] * (MIN_CONFIDENT_RUNS + 1)  # the preferred kernel: not clearly beaten
    settled = seen[MIN_CONFIDENT_RUNS - 1]
    assert settled.why == (
        "math's median (0.8 ms) is more than 10% below sdpa's (1 ms) but their middle halves overlap "
        "(0.7-1.05 ms against 0.95-1.1 ms); settled: the runs of 3 measurements are pooled, and more would not "
        "separate them"
    )
    assert seen[-1].source == "disk cache"


# ---- pooling: a union, whichever order ----------------------------------------------------------------------------


def measured(name: str, runs: Dict[str, List[float]], skipped=()) -> Decision:
    """A decision of one measurement ``name`` over sdpa and math, as measure() would conclude it."""
    candidates = []
    for kernel, times in runs.items():
        if kernel in skipped:
            candidates.append(CandidateResult(kernel, SKIPPED))
            continue
        result = CandidateResult(kernel, OK, samples={name: list(times)})
        measure_module._summarise(result)
        candidates.append(result)
    decision = Decision(bucket="b", kernel="", select="measure", candidates=candidates, measurements=[name])
    return conclude(decision, ["sdpa", "math"], MARGIN, 2.0)


TIMES = st.lists(st.floats(1e-4, 1e-2), min_size=1, max_size=6)


def runs_of(decision: Decision) -> Dict[str, List[float]]:
    return {c.kernel: sorted(all_runs(c.samples)) for c in decision.candidates}


@settings(max_examples=200, deadline=None)
@given(a=st.tuples(TIMES, TIMES), b=st.tuples(TIMES, TIMES), c=st.tuples(TIMES, TIMES))
def test_pooling_is_a_union_that_does_not_depend_on_who_writes_first(a, b, c):
    first, second, third = (measured(n, dict(zip(["sdpa", "math"], t))) for n, t in zip("xyz", (a, b, c)))
    order = ["sdpa", "math"]

    def join(one, other):
        return pool(one, other, order, MARGIN, 2.0)

    both = join(first, second)
    assert runs_of(both) == {k: sorted(x + y) for k, x, y in zip(order, a, b)}
    assert join(second, first).kernel == both.kernel and runs_of(join(second, first)) == runs_of(both)
    assert runs_of(join(both, second)) == runs_of(both)  # a process pooling what it already holds adds nothing
    all_three = join(join(first, second), third)
    assert runs_of(all_three) == runs_of(join(first, join(second, third)))
    assert sorted(all_three.measurements) == ["x", "y", "z"]
    timed = sorted(all_three.candidates, key=lambda r: order.index(r.kernel))
    winner, provisional, _ = pick(timed, MARGIN)
    assert all_three.kernel == winner.kernel and not all_three.provisional  # three measurements: settled
    assert [c.kernel for c in all_three.candidates if c.status == PICKED] == [winner.kernel]


def test_a_candidate_skipped_now_keeps_the_runs_an_earlier_measurement_made():
    earlier = measured("x", {"sdpa": [1e-3] * 5, "math": [2e-3] * 5})
    later = measured("y", {"sdpa": [1e-3] * 5, "math": []}, skipped=["math"])
    assert later.provisional and "math was skipped" in later.why
    joined = pool(earlier, later, ["sdpa", "math"], MARGIN, 2.0)
    math = next(c for c in joined.candidates if c.kernel == "math")
    assert math.status == OK and math.samples == {"x": [2e-3] * 5} and math.reasons == []
    assert joined.kernel == "sdpa" and not joined.provisional
