"""auto's disk cache is read with bounds and checked against this environment and the entry's own timings.

A file too big, too deeply nested or not a regular file, or one that records another torch, device or strategy, is a
miss of the whole file; an entry with an implausible time (NaN, inf, zero, negative), a summary that is not the one of
its recorded runs, an unknown candidate, or a kernel its timings do not make the winner (a slow kernel pinned by hand)
is a miss of that entry. Each is exactly one logged line naming the file (and the entry) and what happens — measured
again, the file or entry rewritten — and the run gives the right answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_port
from npu_port.attn.call import AttentionCall
from npu_port.strategy import measure as measure_module
from npu_port.strategy.cache import MAX_DEPTH, MAX_FILE_BYTES, nested_deeper
from npu_port.strategy.decision import Decision, bucket_key
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import StrategyRouter

SECONDS = {"sdpa": 1e-3, "math": 2e-3}  # steady: sdpa clearly faster, so the first pick is settled


@contextlib.contextmanager
def steady_clock():
    real = measure_module._time_once

    def fake(kernel, call):
        return real(kernel, call)[0], SECONDS[kernel.name]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_module, "_time_once", fake)
        yield


def qkv(s=12):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, s, 8, generator=gen) for _ in range(3)]


def auto_router():
    return StrategyRouter(get_strategy("auto").with_overrides(candidates=["sdpa", "math"], probe_seconds=60.0))


def stored(q, k, v):
    """A valid cache file for (q, k, v): (path, bucket, its JSON)."""
    router = auto_router()
    with steady_clock():
        router(q, k, v)
    cache = next(iter(router.caches.values()))
    bucket = bucket_key(AttentionCall.from_arguments(q, k, v))
    data = json.loads(cache.path.read_text())
    assert data["decisions"][bucket]["kernel"] == "sdpa" and not data["decisions"][bucket]["provisional"]
    return cache.path, bucket, data


def rerun(path, content, q, k, v, caplog, rewritten=True):
    """Write the file, run a fresh router on it; the one line it logged (there must be exactly one)."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict):
        path.write_text(json.dumps(content))  # (json writes NaN and Infinity as Python reads them back)
    router = auto_router()
    with steady_clock(), caplog.at_level(logging.DEBUG, logger="npu_port"):
        out = router(q, k, v)
    torch.testing.assert_close(out, npu_port.attention(q, k, v, kernel="math"), atol=1e-5, rtol=0)
    assert router.probes == 1  # measured again
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1, lines
    assert f"  {lines[0]}" in router.explain_lines()  # and explain() says it too
    if rewritten:
        entry = Decision.from_dict(json.loads(path.read_text())["decisions"][router_bucket(q, k, v)])
        assert entry.kernel == "sdpa" and entry.source == "measured"
        (mine,) = router.decisions[router_bucket(q, k, v)].measurements
        assert entry.measurements == [mine]  # replaced: the entry ignored was not pooled with the new runs
    return lines[0]


def router_bucket(q, k, v):
    return bucket_key(AttentionCall.from_arguments(q, k, v))


def file_line(path, problem):
    return f"disk cache file {path} {problem}: ignored; measuring again (it will be rewritten)"


def entry_line(path, bucket, problem):
    return f"disk cache entry {bucket!r} in {path} ignored: {problem}; measuring again (it will be overwritten)"


# ---- the file: bounds, before any parsing -------------------------------------------------------------------------


def test_a_deeply_nested_file_is_a_miss_not_a_recursion_error(caplog):
    q, k, v = qkv()
    path, _, _ = stored(q, k, v)
    line = rerun(path, b"[" * 100_000, q, k, v, caplog)
    assert line == file_line(path, f"is nested deeper than {MAX_DEPTH} levels")


def test_a_deep_value_inside_a_valid_file_is_a_miss_too(caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    data["decisions"][bucket]["why"] = json.loads("[" * 50 + "]" * 50)
    line = rerun(path, data, q, k, v, caplog)
    assert line == file_line(path, f"is nested deeper than {MAX_DEPTH} levels")


def test_a_file_over_the_size_bound_is_a_miss_without_being_read(caplog):
    q, k, v = qkv()
    path, _, data = stored(q, k, v)
    text = json.dumps(data)
    line = rerun(path, text.encode() + b" " * (MAX_FILE_BYTES + 1 - len(text)), q, k, v, caplog)
    assert line == file_line(path, "is 16.0 MiB, over the 16 MiB a cache file may be")


def test_a_fifo_in_place_of_the_file_is_a_miss_and_never_blocks(caplog):
    q, k, v = qkv()
    path, _, _ = stored(q, k, v)
    path.unlink()
    os.mkfifo(path)  # reading it would wait for a writer for ever, writing it for a reader
    line = rerun(path, None, q, k, v, caplog, rewritten=False)
    assert line == (
        f"disk cache file {path} is not a regular file: ignored; measuring again (delete it to keep decisions again)"
    )
    router = auto_router()
    with steady_clock():
        router(q, k, v)
    assert (
        f"  disk cache not written: cannot write {path}: it is not a regular file; delete it" in router.explain_lines()
    )


# ---- the file: this environment and this strategy -----------------------------------------------------------------


def test_a_file_written_for_another_torch_is_a_miss(caplog):
    q, k, v = qkv()
    path, _, data = stored(q, k, v)
    data["environment"]["torch"] = "1.13.1"
    line = rerun(path, data, q, k, v, caplog)
    assert line == file_line(path, f"was written for torch 1.13.1, this is torch {torch.__version__}")


def test_a_file_written_for_another_device_or_without_diffusers_is_a_miss(caplog):
    q, k, v = qkv()
    path, _, data = stored(q, k, v)
    ours = data["environment"]["device"]
    data["environment"]["device"] = "npu: Ascend910B"
    line = rerun(path, data, q, k, v, caplog)
    assert line == file_line(path, f"was written for device npu: Ascend910B, this is device {ours}")
    del data["environment"]["device"]
    caplog.clear()
    line = rerun(path, data, q, k, v, caplog)
    assert line == file_line(path, f"was written for device (none), this is device {ours}")


def test_a_file_written_for_another_strategy_configuration_is_a_miss(caplog):
    q, k, v = qkv()
    path, _, data = stored(q, k, v)
    data["strategy"]["options"]["margin"] = 0.5
    line = rerun(path, data, q, k, v, caplog)
    assert line == file_line(path, "was written for another strategy configuration (candidates or options differ)")


# ---- the entry: plausible timings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e-3, 0.0])
@pytest.mark.parametrize("field", ["median_s", "low_s", "high_s"])
def test_a_time_that_is_nan_infinite_zero_or_negative_is_a_miss(field, value, caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    data["decisions"][bucket]["candidates"][0][field] = value
    line = rerun(path, data, q, k, v, caplog)
    problem = f"malformed entry (candidate 0: {field} is {value!r}, not a time (finite, > 0))"
    assert line == entry_line(path, bucket, problem)


@pytest.mark.parametrize("value", [float("nan"), float("-inf"), -1e-3, 0])
def test_a_recorded_run_that_is_not_a_time_is_a_miss(value, caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    samples = data["decisions"][bucket]["candidates"][1]["samples"]
    (measurement,) = samples
    samples[measurement][2] = value
    line = rerun(path, data, q, k, v, caplog)
    problem = f"malformed entry (candidate 1: a run of {measurement!r} took {value!r} s, not a time)"
    assert line == entry_line(path, bucket, problem)


def test_a_median_that_is_not_the_one_of_the_recorded_runs_is_a_miss(caplog):
    """Editing the summary to make a kernel look fast, without its runs, is found: the runs are summarised again."""
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    math = next(c for c in data["decisions"][bucket]["candidates"] if c["kernel"] == "math")
    index = data["decisions"][bucket]["candidates"].index(math)
    math["low_s"] = math["median_s"] = math["high_s"] = 1e-6
    line = rerun(path, data, q, k, v, caplog)
    problem = (
        f"malformed entry (candidate {index}: median_s, low_s, high_s and runs [1e-06, 1e-06, 1e-06, 5] are not "
        "those of its recorded runs [0.002, 0.002, 0.002, 5])"
    )
    assert line == entry_line(path, bucket, problem)


def test_runs_of_a_measurement_the_entry_does_not_list_are_a_miss(caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    data["decisions"][bucket]["measurements"] = ["someone-else"]
    line = rerun(path, data, q, k, v, caplog)
    (measurement,) = data["decisions"][bucket]["candidates"][0]["samples"]
    problem = f"malformed entry (candidate 0: runs of measurement {measurement!r}, which is not listed)"
    assert line == entry_line(path, bucket, problem)


# ---- the entry: known kernels, and a winner its timings make the winner -------------------------------------------


def test_a_candidate_that_is_no_kernel_of_the_strategy_is_a_miss(caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    data["decisions"][bucket]["candidates"][1]["kernel"] = "warp_drive"
    line = rerun(path, data, q, k, v, caplog)
    assert line == entry_line(path, bucket, "its candidate 'warp_drive' is not a candidate of strategy 'auto'")


def test_a_slow_kernel_pinned_by_hand_is_a_miss(caplog):
    """math (2 ms) marked the winner over sdpa (1 ms), consistently in every field but the timings."""
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    entry = data["decisions"][bucket]
    entry["kernel"] = "math"
    for candidate in entry["candidates"]:
        candidate["status"] = "picked" if candidate["kernel"] == "math" else "ok"
    line = rerun(path, data, q, k, v, caplog)
    problem = "its timings make 'sdpa' the winner (median 1 ms), not the recorded 'math' (median 2 ms)"
    assert line == entry_line(path, bucket, problem)


def test_a_kernel_that_is_not_the_one_its_candidates_mark_picked_is_a_miss(caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    data["decisions"][bucket]["kernel"] = "math"
    line = rerun(path, data, q, k, v, caplog)
    assert line == entry_line(path, bucket, "it names kernel 'math' but marks 'sdpa' picked")


def test_a_valid_entry_is_used_and_malformed_entries_of_other_buckets_are_not_written_back(caplog):
    q, k, v = qkv()
    path, bucket, data = stored(q, k, v)
    data["decisions"]["not a bucket"] = "garbage"
    path.write_text(json.dumps(data))
    router = auto_router()
    with steady_clock(), caplog.at_level(logging.DEBUG, logger="npu_port"):
        router(q, k, v)  # loaded: nothing measured, nothing said
        router(*qkv(s=5))  # another bucket measured and written
    assert router.probes == 1 and next(iter(router.caches.values())).loads == 1 and caplog.records == []
    assert set(json.loads(path.read_text())["decisions"]) == {bucket, router_bucket(*qkv(s=5))}


# ---- the depth check ------------------------------------------------------------------------------------------------


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(item) for item in value), default=0)
    return 0


TRICKY = st.text(alphabet='[]{}"\\ab', max_size=6)  # brackets, quotes and backslashes inside strings
JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, limit=st.integers(1, 20), indent=st.sampled_from([None, 1]))
def test_the_depth_check_agrees_with_the_parsed_depth(value, limit, indent):
    text = json.dumps(value, indent=indent)
    assert nested_deeper(text, limit) == (depth(value) > limit)


@pytest.mark.parametrize(
    "text, limit, deeper",
    [
        ("[" * 100_000, 16, True),  # unbalanced: walked, stopped at the 17th bracket
        ("[]" * 100_000, 1, False),  # flat: stripped in one pass
        ('["' + "[" * 100 + '"]', 1, False),  # brackets in a string do not count
        ('["\\"' + "[[" + '"]', 1, False),  # nor after an escaped quote
        ("{" * 17 + "}" * 17, 16, True),
        ("{" * 16 + "}" * 16, 16, False),
    ],
)
def test_the_depth_check_on_edge_cases(text, limit, deeper):
    assert nested_deeper(text, limit) is deeper
