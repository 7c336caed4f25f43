"""Ctrl-C in ``npu-port bench`` keeps what was measured: the table, CSV, JSON and PNG are written, marked PARTIAL
(``"partial": true``, how many of how many measurements, and why), with no traceback and exit code 130 — whether the
KeyboardInterrupt is injected after N kernel calls or a real SIGINT reaches an ``npu-port bench`` process. Every
bench output goes through npu_port.atomic."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npu_port import atomic
from npu_port.bench import cells, runner
from npu_port.bench.results import INTERRUPTED, OK
from npu_port.cli.main import main

STRATEGIES = ["vanilla", "sdpa", "chunked"]
ARGV = ["bench", "--shapes", "custom:1,2,32,8", "--strategies", ",".join(STRATEGIES), "--warmup", "1", "--repeats", "2"]
#: kernel calls per shape with --warmup 1 --repeats 2 and three strategies: 3 warm-up, 2 x 3 timed, 3 to finish
CALLS_PER_SHAPE = 12


def bench_argv(out: Path):
    return [
        "bench",
        "--shapes",
        "custom:1,2,32,8,custom:1,2,48,8",
        "--strategies",
        ",".join(STRATEGIES),
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--output",
        str(out),
    ]


def interrupt_at_call(monkeypatch, number: int) -> None:
    """Make the ``number``-th kernel call of the bench raise KeyboardInterrupt, as Ctrl-C would there."""
    original = cells.RunningCell.once
    count = {"calls": 0}

    def once(self, call):
        count["calls"] += 1
        if count["calls"] == number:
            raise KeyboardInterrupt
        return original(self, call)

    monkeypatch.setattr(cells.RunningCell, "once", once)


def read_csv(path: Path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize(
    "call, measured, statuses_of_second_shape, timed_before_stop",
    [
        (1, 0, None, None),  # the first warm-up call: nothing measured
        (CALLS_PER_SHAPE + 1, 3, [INTERRUPTED] * 3, [0, 0, 0]),  # right after the first shape
        (CALLS_PER_SHAPE + 3 + 3 + 2, 3, [INTERRUPTED] * 3, [1, 2, 1]),  # mid-way through the second shape's timing
    ],
)
def test_ctrl_c_after_n_calls_writes_the_partial_results(
    tmp_path, monkeypatch, capsys, call, measured, statuses_of_second_shape, timed_before_stop
):
    written = []
    original_atomic_path = atomic.atomic_path

    def spying_atomic_path(path, **kwargs):
        written.append(Path(path).name)
        return original_atomic_path(path, **kwargs)

    monkeypatch.setattr(atomic, "atomic_path", spying_atomic_path)
    interrupt_at_call(monkeypatch, call)

    assert main(bench_argv(tmp_path)) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err == ""
    shape_name = "custom-1x2x32x8" if measured == 0 else "custom-1x2x48x8"
    summary = (
        f"PARTIAL RESULTS: interrupted (Ctrl-C) while measuring shape {shape_name}; {measured} of 6 measurements "
        "(strategy x shape) done"
    )
    lines = captured.out.splitlines()
    assert lines[0] == summary and lines[-2] == summary
    names = ("bench.csv", "bench.json", "bench.png")
    assert lines[-1] == "wrote partial results: " + ", ".join(str(tmp_path / n) for n in names)
    assert written == list(names)  # every output through npu_port.atomic
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # no temporary file left behind

    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["partial"] is True and (data["measured_cells"], data["planned_cells"]) == (measured, 6)
    assert data["stopped_because"] == f"interrupted (Ctrl-C) while measuring shape {shape_name}"
    cells = data["cells"]
    assert [c["status"] for c in cells[:measured]] == [OK] * measured
    assert all(c["parity_ok"] is True and c["median_s"] > 0 for c in cells[:measured])
    if statuses_of_second_shape is not None:
        second = cells[measured:]
        assert [c["status"] for c in second] == statuses_of_second_shape
        assert [c["runs"] for c in second] == timed_before_stop
        for c in second:
            assert c["note"].startswith(f"interrupted after {c['runs']} of 2 timed calls; no memory or parity figures")
            assert c["parity_ok"] is None and c["peak_bytes"] is None
    rows = read_csv(tmp_path / "bench.csv")
    assert [r["status"] for r in rows] == [c["status"] for c in cells]
    assert {r["partial_run"] for r in rows} <= {"True"}
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_complete_run_is_marked_complete(tmp_path, capsys):
    assert main(bench_argv(tmp_path)) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert (data["partial"], data["measured_cells"], data["planned_cells"], data["stopped_because"]) == (
        False,
        6,
        6,
        None,
    )
    assert {r["partial_run"] for r in read_csv(tmp_path / "bench.csv")} == {"False"}
    assert "PARTIAL" not in capsys.readouterr().out


def test_a_second_ctrl_c_while_writing_leaves_each_file_whole_or_as_it_was(tmp_path, monkeypatch, capsys):
    (tmp_path / "bench.json").write_text('{"previous": "run"}\n')
    interrupt_at_call(monkeypatch, CALLS_PER_SHAPE + 1)

    def interrupted_json(report, path):
        raise KeyboardInterrupt

    monkeypatch.setattr("npu_port.bench.report.write_json", interrupted_json)
    assert main(bench_argv(tmp_path)) == 130
    captured = capsys.readouterr()
    assert captured.err == (
        "npu-port: interrupted again while writing the results; files not yet written were left as they were\n"
    )
    assert json.loads((tmp_path / "bench.json").read_text()) == {"previous": "run"}
    assert len(read_csv(tmp_path / "bench.csv")) == 6


def test_ctrl_c_before_measuring_says_nothing_was_written(monkeypatch, capsys):
    def interrupted(text):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "select_strategies", interrupted)
    assert main(ARGV) == 130
    assert capsys.readouterr().err == (
        "npu-port: bench interrupted (Ctrl-C) before anything was measured; nothing written\n"
    )


#: ``npu-port bench`` in a child process; it touches READY at the first kernel call of the second (slow) shape, so
#: that the SIGINT the test then sends lands while that shape is being measured. Nothing else is changed.
CHILD = """
import sys
from pathlib import Path
from npu_port.bench.cells import RunningCell
from npu_port.cli.main import main

ready, first_of_second_shape = Path(sys.argv[1]), int(sys.argv[2])
original = RunningCell.once
calls = [0]

def once(self, call):
    calls[0] += 1
    if calls[0] == first_of_second_shape:
        ready.touch()
    return original(self, call)

RunningCell.once = once
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is a POSIX signal")
def test_a_real_sigint_to_npu_port_bench_writes_partial_results_and_exits_130(tmp_path):
    out, ready = tmp_path / "out", tmp_path / "ready"
    repeats = 40
    argv = [
        "bench",
        "--shapes",
        "custom:1,1,16,8,custom:2,4,1024,64",
        "--strategies",
        ",".join(STRATEGIES),
        "--warmup",
        "1",
        "--repeats",
        str(repeats),
        "--output",
        str(out),
        "--no-plot",
    ]
    first_call_of_second_shape = 3 * (1 + repeats + 1) + 1
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ready), str(first_call_of_second_shape), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the bench never reached its second shape"
            time.sleep(0.01)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    summary = (
        "PARTIAL RESULTS: interrupted (Ctrl-C) while measuring shape custom-2x4x1024x64; 3 of 6 measurements "
        "(strategy x shape) done"
    )
    assert stdout.splitlines()[0] == summary
    data = json.loads((out / "bench.json").read_text())
    assert (data["partial"], data["measured_cells"], data["planned_cells"]) == (True, 3, 6)
    assert [c["status"] for c in data["cells"][:3]] == [OK] * 3
    assert all(c["status"] == INTERRUPTED for c in data["cells"][3:])
    assert len(read_csv(out / "bench.csv")) == len(data["cells"])
