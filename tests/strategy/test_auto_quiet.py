"""auto is quiet: one line per process (at exit, or in ``npu-port run``'s summary) saying what it picked over how many
buckets and how many picks are provisional; the details in ``handle.explain()`` and ``npu-port run --verbose``.
Processes sharing a cache folder pool their runs of a bucket instead of overwriting each other's."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import npu_port
from npu_port.strategy.decision import Decision, all_runs
from npu_port.strategy.summary import DETAILS, SUMMARY

#: A program whose auto runs on a machine noisy the same way every time: for each of three shapes, math's median is
#: 20% below sdpa's (more than the 10% margin) but their middle halves overlap, so a measurement leaves the pick
#: open; every other kernel is steady and slow. ``own`` applies auto itself (sdpa and math only); under npu-port run
#: the run's auto routes the calls.
PROGRAM = textwrap.dedent(
    """
    import sys
    from collections import Counter

    import torch

    import npu_port
    from npu_port.strategy import measure

    NOISY = {
        "sdpa": [1.00, 1.00, 0.90, 0.95, 1.00, 1.10, 1.20],  # first run, untimed round, 5 timed rounds (ms)
        "math": [0.80, 0.80, 0.60, 0.70, 0.80, 1.05, 1.10],
    }
    real, turn = measure._time_once, Counter()

    def noisy(kernel, call):
        script = NOISY.get(kernel.name, [5.0])
        turn[kernel.name] += 1
        return real(kernel, call)[0], script[(turn[kernel.name] - 1) % len(script)] * 1e-3

    measure._time_once = noisy
    if sys.argv[1:] == ["own"]:
        handle = npu_port.set_attention_strategy("auto", candidates=["sdpa", "math"], probe_seconds=60.0)
    for s in (12, 20, 28):
        q = torch.randn(1, 2, s, 8, generator=torch.Generator().manual_seed(s))
        npu_port.attention(q, q, q)
    """
)


def line(measured, cached, provisional):
    state = f"{provisional} provisional: the next runs measure them more" if provisional else "none provisional"
    return (
        f"npu-port auto: 3 shape buckets -> sdpa 3 ({measured} measured, {cached} from the disk cache; {state}); "
        f"{DETAILS}"
    )


def _run(arguments, folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NPU_PORT_CACHE_DIR": str(folder / "cache")}
    env.pop("NPU_PORT_STRATEGY_PATH", None)
    done = subprocess.run(arguments, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.e2e
@pytest.mark.slow
def test_each_run_of_a_noisy_program_says_one_line_and_the_picks_settle(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    said = [_run([sys.executable, "program.py", "own"], tmp_path).stderr for _ in range(4)]
    assert said == [
        line(3, 0, 3) + "\n",  # measured: open
        line(3, 0, 3) + "\n",  # measured more, the runs of 2 measurements pooled: still open
        line(3, 0, 0) + "\n",  # the runs of 3 measurements: settled
        line(0, 3, 0) + "\n",  # loaded, nothing measured
    ]


@pytest.mark.e2e
@pytest.mark.slow
def test_npu_port_run_shows_the_line_in_its_summary_the_details_with_verbose_and_the_data_in_its_report(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    run = [sys.executable, "-m", "npu_port", "run", "--device", "cpu"]
    plain = _run([*run, "program.py"], tmp_path).stderr.splitlines()
    assert plain[1] == "  " + line(3, 0, 3) and sum("npu-port auto:" in text for text in plain) == 1
    assert not any(text.lstrip().startswith("bucket ") for text in plain)  # no details without --verbose

    verbose = _run([*run, "--verbose", "program.py"], tmp_path).stderr
    assert f"\n  {line(3, 0, 3)}\n" in verbose and verbose.count("npu-port auto:") == 1
    details = verbose[verbose.index("\nstrategy auto (select: measure; ") :]
    assert details.count("\n  bucket cpu float32 B=1 H=2/2 ") == 3
    assert details.count("; runs of 2 measurements pooled; provisional]") == 3
    assert details.count("\n      -> sdpa, provisional: math's median (0.8 ms) is more than 10% below sdpa's") == 3

    reported = _run([*run, "--report", "run.json", "program.py"], tmp_path)
    assert reported.stderr == ""  # the report holds it all
    auto = json.loads((tmp_path / "run.json").read_text())["auto"]
    assert auto == {
        "auto": {"buckets": 3, "kernels": {"sdpa": 3}, "from_disk_cache": 0, "provisional": 0, "measured": 3}
    }


#: One of several processes measuring the same provisional bucket at once: each pools the stored entry with its own
#: runs, then waits until every process has measured before writing — the race in which last-writer-wins would
#: keep one process's runs and drop the others'.
WRITER = textwrap.dedent(
    """
    import json, os, random, sys, time

    import torch

    from npu_port.strategy import cache, measure
    from npu_port.strategy.registry import get_strategy
    from npu_port.strategy.router import StrategyRouter

    index, count, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng, real = random.Random(index), measure._time_once
    base = {"sdpa": 1e-3, "math": 0.85e-3}
    measure._time_once = lambda kernel, call: (real(kernel, call)[0], base[kernel.name] * rng.uniform(1.0, 1.6))
    put = cache.DecisionCache.put

    def put_when_all_have_measured(self, decision, merge=None):
        open(os.path.join(folder, f"ready-{index}"), "w").close()
        deadline = time.monotonic() + 120
        while sum(name.startswith("ready-") for name in os.listdir(folder)) < count:
            if time.monotonic() > deadline:
                raise SystemExit("the other writers never got ready")
            time.sleep(0.01)
        put(self, decision, merge)

    cache.DecisionCache.put = put_when_all_have_measured
    router = StrategyRouter(get_strategy("auto").with_overrides(candidates=["sdpa", "math"], probe_seconds=60.0))
    q = torch.randn(1, 2, 12, 8, generator=torch.Generator().manual_seed(0))
    router(q, q, q)
    (decision,) = router.decisions.values()
    print(json.dumps({"measurements": decision.measurements, "path": str(router.caches["cpu"].path)}))
    """
)


@pytest.mark.e2e
@pytest.mark.slow
def test_processes_measuring_one_bucket_at_once_pool_their_runs_without_a_word(tmp_path):
    from .test_auto_converge import noisy_the_same_way_every_time

    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "barrier").mkdir()
    # the same threads as this process: the cpu's name in the cache key says how many (pytest-xdist lowers them)
    env = {**os.environ, "NPU_PORT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    with pytest.MonkeyPatch.context() as patch:  # the stored entry they all find: provisional, one measurement
        patch.setenv("NPU_PORT_CACHE_DIR", env["NPU_PORT_CACHE_DIR"])
        handle = npu_port.set_attention_strategy("auto", candidates=["sdpa", "math"], probe_seconds=60.0)
        with noisy_the_same_way_every_time():
            npu_port.attention(*[torch.randn(1, 2, 12, 8, generator=torch.Generator().manual_seed(0))] * 3)
        (first,) = handle.router.decisions.values()
        handle.restore()
    assert first.provisional and len(first.measurements) == 1
    count = 3
    writers = [
        subprocess.Popen(
            [sys.executable, "writer.py", str(index), str(count), str(tmp_path / "barrier")],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]
    outputs = [writer.communicate(timeout=300) for writer in writers]
    assert [writer.returncode for writer in writers] == [0] * count, [err[-2000:] for _, err in outputs]
    for _, err in outputs:  # nothing but each process's own line at exit
        assert err.startswith("npu-port auto: 1 shape bucket -> ") and err.count("\n") == 1, err
    seen = [json.loads(out) for out, _ in outputs]
    for found in seen:
        assert found["measurements"][0] == first.measurements[0] and len(found["measurements"]) == 2
    stored = json.loads(Path(seen[0]["path"]).read_text())["decisions"]
    (entry,) = stored.values()
    final = Decision.from_dict(entry)  # valid
    union = {first.measurements[0], *(found["measurements"][1] for found in seen)}
    assert set(final.measurements) == union and len(union) == 1 + count  # every process's runs, none lost
    for candidate in final.candidates:
        assert candidate.runs == len(all_runs(candidate.samples)) == 5 * (1 + count)
    assert not final.provisional  # four measurements pooled: settled


def test_the_line_counts_buckets_kernels_and_provisional_picks_and_is_logged_once(caplog):
    from .test_auto_converge import noisy_the_same_way_every_time

    SUMMARY.reset()
    assert SUMMARY.line() is None  # nothing routed: nothing to say
    handle = npu_port.set_attention_strategy("auto", candidates=["sdpa", "math"], probe_seconds=60.0)
    try:
        with noisy_the_same_way_every_time():
            for s in (12, 20, 28):
                npu_port.attention(*[torch.randn(1, 2, s, 8, generator=torch.Generator().manual_seed(s))] * 3)
        explained = handle.explain()
    finally:
        handle.restore()
    assert SUMMARY.line() == line(3, 0, 3)
    assert explained.count("-> sdpa, provisional: ") == 3  # the details are there
    with caplog.at_level(logging.WARNING, logger="npu_port.strategy"):
        SUMMARY.emit()
        SUMMARY.emit()
    assert [record.getMessage() for record in caplog.records] == [line(3, 0, 3)]
    SUMMARY.reset()
    assert SUMMARY.claim() is None and SUMMARY.claimed
