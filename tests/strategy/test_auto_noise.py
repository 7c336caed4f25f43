"""auto against timing noise: a spike in one run, a faster kernel within the margin, noise that hides the answer.

The timings are scripted: every run auto times goes through ``npu_port.strategy.measure._time_once``, which these
tests replace with one that still runs the kernel (so parity and NaN checks are real) but reports the seconds the
test chose. auto's call order per kernel is fixed — the first run, ``warmup - 1`` untimed rounds, then ``repeats``
timed rounds — so a script is that list of seconds per kernel.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import time
from typing import Dict, List, Optional, Sequence

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npu_port.attn import get_kernel
from npu_port.attn.call import AttentionCall
from npu_port.strategy import measure as measure_module
from npu_port.strategy.decision import PICKED, Decision, all_runs, bucket_key
from npu_port.strategy.measure import MIN_CONFIDENT_RUNS, measure
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter
from npu_port.strategy.spec import DEFAULT_OPTIONS, check_option

WARMUP, REPEATS = DEFAULT_OPTIONS["warmup"], DEFAULT_OPTIONS["repeats"]
UNTIMED = WARMUP - 1  # untimed rounds after each kernel's first run (see measure._time_round_robin)
MS = 1e-3


def qkv(s=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, s, 8, generator=gen) for _ in range(3)]


def script(timed: Sequence[float], first: Optional[float] = None) -> List[float]:
    """The seconds one kernel reports, in auto's order: first run, untimed rounds, then the timed rounds."""
    first = statistics.median(timed) if first is None else first
    return [first] * (1 + UNTIMED) + list(timed)


@contextlib.contextmanager
def scripted(timings: Dict[str, List[float]], stall: Sequence[str] = ()):
    """Replace auto's clock: each kernel reports its scripted seconds in turn (and must not run more often). The
    kernels named in ``stall`` really take their first scripted seconds (a sleep), so that the probe budget, which is
    counted on the wall clock, is spent as it would be."""
    real = measure_module._time_once
    left = {name: list(values) for name, values in timings.items()}
    stalling = set(stall)

    def fake(kernel, call):
        out, _ = real(kernel, call)
        assert left.get(kernel.name), f"{kernel.name} timed more often than scripted"
        seconds = left[kernel.name].pop(0)
        if kernel.name in stalling:
            stalling.discard(kernel.name)
            time.sleep(seconds)
        return out, seconds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_module, "_time_once", fake)
        yield left
    assert all(not rest for rest in left.values()), f"scripted runs not used: {left}"


def decide(
    timings: Dict[str, List[float]],
    margin: float = DEFAULT_OPTIONS["margin"],
    probe_seconds: float = 60.0,
    stall: Sequence[str] = (),
) -> Decision:
    """measure() over the scripted kernels, in the order given (the first is the preferred one). The probe budget is
    generous by default so that a slow test machine cannot cut the rounds short and change what is compared."""
    call = AttentionCall.from_arguments(*qkv())
    kernels = [get_kernel(name) for name in timings]
    with scripted(timings, stall):
        return measure(
            call,
            bucket_key(call),
            kernels,
            budget_bytes=None,
            warmup=WARMUP,
            repeats=REPEATS,
            probe_seconds=probe_seconds,
            parity_rows=8,
            margin=margin,
        )


def by_name(decision: Decision):
    return {c.kernel: c for c in decision.candidates}


def auto_router(**overrides):
    options = dict(candidates=["sdpa", "math"], probe_seconds=60.0)
    options.update(overrides)
    return StrategyRouter(get_strategy("auto").with_overrides(**options))


# ---- the rule -----------------------------------------------------------------------------------------------------


def test_a_single_spike_in_the_preferred_kernel_does_not_hand_the_bucket_to_another():
    sdpa = [1.00 * MS, 1.01 * MS, 60.0 * MS, 0.99 * MS, 1.00 * MS]  # one run 60 times slower: a busy moment
    math = [0.96 * MS, 0.97 * MS, 0.95 * MS, 0.96 * MS, 0.97 * MS]  # 4% faster: within the 10% margin
    decision = decide({"sdpa": script(sdpa), "math": script(math)})
    assert decision.kernel == "sdpa" and not decision.provisional
    timed = by_name(decision)["sdpa"]
    ordered = sorted(sdpa)  # inclusive quartiles of 5 runs: the 2nd and 4th fastest; the spike is in neither
    assert (timed.low_s, timed.median_s, timed.high_s, timed.runs) == (ordered[1], ordered[2], ordered[3], 5)
    lines = decision.explain_lines()
    assert f"(median of 5, middle half {ordered[1] * 1e3:.3f}-{ordered[3] * 1e3:.3f} ms)" in lines[1]
    assert lines[0].endswith("]") and "provisional" not in "\n".join(lines)
    assert lines[-1] == "    -> sdpa: first in strategy order, and no candidate is clearly faster (margin 10%)"


@pytest.mark.parametrize("speedup, margin, winner", [(1.08, 0.10, "sdpa"), (1.30, 0.10, "math"), (1.30, 0.50, "sdpa")])
def test_a_later_candidate_wins_only_when_clearly_faster_than_the_margin(speedup, margin, winner):
    """No overlap in any case (the runs are steady): only the margin decides."""
    math = [1.000 * MS, 1.002 * MS, 1.001 * MS, 1.003 * MS, 1.000 * MS]
    sdpa = [t * speedup for t in math]  # the preferred kernel is the slower one, by ``speedup``
    decision = decide({"sdpa": script(sdpa), "math": script(math)}, margin=margin)
    assert decision.kernel == winner and not decision.provisional
    assert by_name(decision)[winner].status == PICKED
    if winner == "math":
        assert decision.why.startswith("clearly faster than the preferred sdpa: median 1 ms against 1.3 ms")
    else:
        assert decision.why == f"first in strategy order, and no candidate is clearly faster (margin {margin:.0%})"


def test_a_faster_median_whose_runs_overlap_keeps_the_preferred_kernel_provisionally():
    sdpa = [0.90 * MS, 0.95 * MS, 1.00 * MS, 1.10 * MS, 1.20 * MS]
    math = [0.60 * MS, 0.70 * MS, 0.80 * MS, 1.05 * MS, 1.10 * MS]  # median 20% lower, but q3 1.05 > sdpa's q1 0.95
    decision = decide({"sdpa": script(sdpa), "math": script(math)})
    assert decision.kernel == "sdpa" and decision.provisional
    assert decision.why == (
        "math's median (0.8 ms) is more than 10% below sdpa's (1 ms) but their middle halves overlap "
        "(0.7-1.05 ms against 0.95-1.1 ms)"
    )
    lines = decision.explain_lines()
    assert lines[0].endswith("; provisional]")
    assert lines[-2] == f"    -> sdpa, provisional: {decision.why}"
    assert lines[-1] == "       (used by this process; the next process adds its runs of this bucket)"


def test_first_runs_too_long_for_one_round_leave_a_non_preferred_winner_provisional():
    """First runs so long that not even one round fits the budget: each kernel is judged on its first run, so a
    non-preferred winner has fewer than MIN_CONFIDENT_RUNS runs behind it and is not kept for good."""
    decision = decide({"sdpa": [2.0], "math": [1.0]}, probe_seconds=1.5)  # a round: 3 s, over the 1.5 s budget
    assert decision.kernel == "math" and decision.provisional
    assert by_name(decision)["math"].runs == 1 < MIN_CONFIDENT_RUNS
    assert decision.why == (f"math beat the preferred sdpa on 1 timed run, fewer than {MIN_CONFIDENT_RUNS}")


def test_a_spike_in_a_challengers_first_run_does_not_cancel_the_rounds():
    """math's first run is 100 times its quiet runs (a 100 s stall, more than the 60 s budget): the plan counts it
    as at most 10 times the fastest first run (20 s), so the rounds run, and math, twice as fast, wins on them."""
    sdpa = script([2.0] * REPEATS)
    math = script([1.0] * REPEATS, first=100.0)
    decision = decide({"sdpa": sdpa, "math": math})
    assert decision.kernel == "math" and not decision.provisional
    assert by_name(decision)["math"].runs == REPEATS and by_name(decision)["sdpa"].runs == REPEATS
    assert decision.why.startswith("clearly faster than the preferred sdpa: median 1e+03 ms against 2e+03 ms")


STALL = 0.3  # the preferred kernel's first run really takes this long: longer than the budget below
STALLED = {"sdpa": [STALL], "math": []}  # math never runs: skipped, the budget is spent


def test_a_stall_in_the_preferred_kernels_first_run_leaves_the_others_skipped_and_the_pick_provisional():
    decision = decide(STALLED, probe_seconds=STALL / 3, stall=["sdpa"])
    assert decision.kernel == "sdpa" and decision.provisional
    assert by_name(decision)["sdpa"].runs == 1  # not run again: the budget is spent
    assert by_name(decision)["math"].status == "skipped"
    assert decision.why == "math was skipped: the probe time budget (0.1 s) was spent before it could run"


def test_a_pick_with_skipped_candidates_is_not_loaded_from_the_disk_cache_by_the_next_process():
    q, k, v = qkv()
    bucket = bucket_key(AttentionCall.from_arguments(q, k, v))
    first = auto_router(probe_seconds=STALL / 3)
    with scripted(STALLED, stall=["sdpa"]):
        first(q, k, v)
    decision = first.decisions[bucket]
    assert decision.kernel == "sdpa" and decision.provisional
    path = next(iter(first.caches.values())).path
    assert json.loads(path.read_text())["decisions"][bucket]["provisional"] is True

    later = auto_router()  # the next process, on a quiet machine: measures again, math clearly faster
    with scripted(QUIET):
        later(q, k, v)
    cache = next(iter(later.caches.values()))
    assert cache.path == path and cache.loads == 0 and later.probes == 1
    assert later.decisions[bucket].kernel == "math" and not later.decisions[bucket].provisional


BAND = 0.02  # steady runs: each within 2% above its kernel's base time


def _near_threshold(base: Dict[str, float], margin: float) -> bool:
    """Whether two bases are so close to the margin's threshold that runs within BAND could fall either side."""
    low, high = (1 + margin) / (1 + BAND), (1 + margin) * (1 + BAND)
    return any(low <= a / b <= high for x, a in base.items() for y, b in base.items() if x != y)


@settings(max_examples=100, deadline=None)
@given(
    order=st.permutations(["sdpa", "chunked", "math"]),
    count=st.integers(2, 3),
    bases=st.lists(st.floats(1e-5, 1e-2), min_size=3, max_size=3),
    jitter=st.lists(st.floats(0.0, BAND), min_size=3 * (UNTIMED + REPEATS), max_size=3 * (UNTIMED + REPEATS)),
    margin=st.sampled_from([0.0, 0.10, 0.25]),
    spiked=st.integers(0, 2),
    sample=st.integers(0, UNTIMED + REPEATS - 1),
    spike=st.floats(1.0, 1e6),
)
def test_one_spike_of_any_size_in_any_one_run_never_changes_the_pick(
    order, count, bases, jitter, margin, spiked, sample, spike
):
    """Steady runs around each kernel's base time, bases not near the margin's threshold: multiplying any one
    warm-up or timed run of any kernel by any factor leaves the pick as it was. (A spike in a first run, which
    the budget is planned from, is the case of test_a_spike_in_a_challengers_first_run_does_not_cancel_the_rounds.)"""
    names = order[:count]
    base = dict(zip(names, bases))
    assume(not _near_threshold(base, margin))
    rounds = UNTIMED + REPEATS
    steady = {name: [base[name] * (1 + jitter[i * rounds + r]) for r in range(rounds)] for i, name in enumerate(names)}
    quiet = decide({name: [base[name]] + runs for name, runs in steady.items()}, margin)
    victim = names[spiked % count]
    steady[victim][sample] *= spike
    noisy = decide({name: [base[name]] + runs for name, runs in steady.items()}, margin)
    assert noisy.kernel == quiet.kernel


# ---- the option ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 1.0, -0.1, float("nan"), True, "0.1", None])
def test_margin_must_be_a_fraction_below_one(value):
    with pytest.raises(ValueError) as info:
        check_option("margin", value)
    assert str(info.value) == f"margin must be a number >= 0 and < 1, got {value!r}"


def test_the_margin_option_reaches_the_decision_and_keys_the_cache():
    assert check_option("margin", 0) == 0.0
    q, k, v = qkv()
    math = [1.0 * MS] * 5
    results = {}
    for margin in (0.10, 0.50):
        router = auto_router(margin=margin)
        with scripted({"sdpa": script([1.3 * MS] * 5), "math": script(math)}):
            router(q, k, v)
        results[margin] = (next(iter(router.decisions.values())).kernel, next(iter(router.caches.values())).path)
    assert results[0.10][0] == "math" and results[0.50][0] == "sdpa"
    assert results[0.10][1] != results[0.50][1]  # another margin decides differently: its own cache file


# ---- provisional decisions and the disk cache ---------------------------------------------------------------------


NOISY = {  # math's median 20% lower, middle halves overlapping: noise hides which is faster
    "sdpa": script([0.90 * MS, 0.95 * MS, 1.00 * MS, 1.10 * MS, 1.20 * MS]),
    "math": script([0.60 * MS, 0.70 * MS, 0.80 * MS, 1.05 * MS, 1.10 * MS]),
}
QUIET = {  # math clearly faster
    "sdpa": script([1.00 * MS, 1.01 * MS, 1.00 * MS, 1.02 * MS, 1.01 * MS]),
    "math": script([0.60 * MS, 0.61 * MS, 0.60 * MS, 0.62 * MS, 0.61 * MS]),
}


def test_a_provisional_decision_is_used_here_cached_as_such_and_measured_more_by_the_next_process(caplog):
    q, k, v = qkv()
    bucket = bucket_key(AttentionCall.from_arguments(q, k, v))
    first = auto_router()
    with scripted(NOISY):
        for _ in range(3):
            first(q, k, v)
    assert first.probes == 1  # used by this process without measuring again
    decision = first.decisions[bucket]
    assert decision.kernel == "sdpa" and decision.provisional
    path = next(iter(first.caches.values())).path
    stored = json.loads(path.read_text())["decisions"][bucket]
    assert stored["provisional"] is True and stored["why"] == decision.why
    assert "; provisional]" in "\n".join(first.explain_lines())

    later = auto_router()  # a later process: a new router on the same cache directory
    with scripted(QUIET), caplog.at_level(logging.WARNING, logger="npu_port.strategy"):
        later(q, k, v)
    cache = next(iter(later.caches.values()))
    assert later.probes == 1 and cache.loads == 0 and cache.pooled == 1
    assert [r for r in caplog.records if r.name == "npu_port.strategy"] == []  # nothing a user could act on
    settled = later.decisions[bucket]
    assert settled.kernel == "math" and not settled.provisional  # the quiet runs separate them, pooled or not
    assert len(settled.measurements) == 2 and settled.measurements[0] == decision.measurements[0]
    runs = {c.kernel: sorted(all_runs(c.samples)) for c in settled.candidates}
    assert runs == {name: sorted(NOISY[name][-REPEATS:] + QUIET[name][-REPEATS:]) for name in ("sdpa", "math")}
    explained = "\n".join(later.explain_lines())
    assert "(0 decisions loaded, 1 written, 1 provisional measured more)" in explained
    assert "; runs of 2 measurements pooled]" in explained and "(median of 10, middle half" in explained
    stored = json.loads(path.read_text())["decisions"][bucket]
    assert stored["provisional"] is False and stored["kernel"] == "math"

    last = auto_router()
    with scripted({}):  # any timing at all would fail: the confident entry is loaded
        last(q, k, v)
    cache = next(iter(last.caches.values()))
    assert last.probes == 0 and cache.loads == 1 and not cache.ignored
    assert last.decisions[bucket].kernel == "math" and last.decisions[bucket].source == "disk cache"


def test_an_entry_without_its_optional_fields_still_loads():
    """Spreads, runs, provisional and why are optional when reading (a hand-written entry may leave them out)."""
    q, k, v = qkv()
    bucket = bucket_key(AttentionCall.from_arguments(q, k, v))
    writer = auto_router()
    with scripted(QUIET):
        writer(q, k, v)
    path = next(iter(writer.caches.values())).path
    data = json.loads(path.read_text())
    entry = data["decisions"][bucket]
    for name in ("provisional", "why", "measurements"):
        del entry[name]
    for candidate in entry["candidates"]:
        del candidate["low_s"], candidate["high_s"], candidate["samples"]
    path.write_text(json.dumps(data))
    assert not Decision.from_dict(entry, bucket).provisional
    reader = auto_router()
    with scripted({}):
        reader(q, k, v)
    assert reader.probes == 0 and next(iter(reader.caches.values())).loads == 1
    lines = reader.explain_lines()
    assert any(line.endswith("(median of 5)  parity 0.0e+00 <= 3e-04") for line in lines)  # math: exact parity
    assert not any("middle half" in line for line in lines)
    assert f"      -> {entry['kernel']}" in lines  # no reason recorded, none made up
