"""``npu-port run --report`` lists by scan rule code what the run handled, where, and how often — and ``npu-port scan``
of the same script lists the same codes, at the same lines, as handled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "port-a-cuda-project.md"

#: A CUDA-written script: a flash_attn import (no flash-attn here: the drop-in is served), `.cuda()` in a loop,
#: `torch.cuda.synchronize()`, a "cuda" literal and a device-type check.
SCRIPT = """\
import torch
from flash_attn import flash_attn_func


def main():
    batches = [torch.randn(2, 8) for _ in range(3)]
    moved = [batch.cuda() for batch in batches]
    torch.cuda.synchronize()
    total = torch.zeros(2, 8, device="cuda")
    for batch in moved:
        total += batch
    if total.device.type == "cuda":
        print("ran as on cuda:", callable(flash_attn_func))


if __name__ == "__main__":
    main()
"""
#: Code -> (name, count, lines) the run handles in SCRIPT.
EXPECTED = {
    "NPU101": ("flash-attn-import", 1, [2]),
    "NPU301": ("cuda-method", 3, [7]),
    "NPU302": ("cuda-sync-memory", 1, [8]),
    "NPU310": ("cuda-device-literal", 1, [9]),
    "NPU390": ("device-type-check", 1, [12]),
}


def _environment(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(tmp_path / "cache"))
    return env


def _npu_port(tmp_path, *arguments):
    return subprocess.run(
        [sys.executable, "-m", "npu_port", *arguments],
        cwd=tmp_path,
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.e2e
def test_the_report_lists_by_code_what_run_handled_and_scan_agrees(tmp_path, script):
    ran = _npu_port(tmp_path, "run", "--device", "cpu", "--report", "r.json", "train.py")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "ran as on cuda: True\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["by_rule"] == {
        code: {"name": name, "count": count, "where": [f"{script}:{line}" for line in lines]}
        for code, (name, count, lines) in EXPECTED.items()
    }

    scanned = _npu_port(tmp_path, "scan", "--format", "json", "train.py")
    findings = json.loads(scanned.stdout)["findings"]
    handled = {}
    for finding in findings:
        if finding["severity"] == "handled":
            handled.setdefault(finding["code"], []).append(finding["line"])
    assert handled == {code: lines for code, (_, _, lines) in EXPECTED.items()}  # the same codes, the same lines
    assert [f["code"] for f in findings if f["severity"] != "handled"] == []


@pytest.mark.e2e
def test_the_summary_at_exit_lists_the_same_codes_sorted(tmp_path, script):
    ran = _npu_port(tmp_path, "run", "--device", "cpu", "train.py")
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stderr.splitlines()
    start = lines.index("  handled, by scan rule (npu-port scan lists these codes as handled):")
    assert lines[start + 1 : start + 1 + len(EXPECTED)] == [
        f"    {code} {name} x{count}  ({', '.join(f'train.py:{line}' for line in where)})"
        for code, (name, count, where) in sorted(EXPECTED.items())
    ]
    assert start + 1 + len(EXPECTED) == len(lines)  # the listing ends the summary
    listing = "\n".join(lines[start:])
    assert listing in TUTORIAL.read_text(encoding="utf-8")  # the tutorial shows this very run's listing


@pytest.mark.e2e
def test_a_script_without_device_checks_does_not_import_the_scan_package(tmp_path):
    (tmp_path / "plain.py").write_text('import sys\n\nprint("scan imported:", "npu_port.scan" in sys.modules)\n')
    ran = _npu_port(tmp_path, "run", "--device", "cpu", "plain.py")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "scan imported: False\n"  # about 30 ms of start-up the program does not pay
    assert "handled, by scan rule: none" in ran.stderr


@pytest.mark.e2e
def test_xformers_calls_the_drop_in_made_are_listed_as_npu112_and_scan_agrees(tmp_path):
    (tmp_path / "attend.py").write_text(
        "import torch\n"
        "import xformers.ops as xops\n"
        "\n"
        "q = k = v = torch.randn(1, 4, 2, 8)\n"
        "for _ in range(2):\n"
        "    out = xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())\n"
        "print(tuple(out.shape))\n"
    )
    ran = _npu_port(tmp_path, "run", "--device", "cpu", "--report", "r.json", "attend.py")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "(1, 4, 2, 8)\n"
    where = str(tmp_path / "attend.py")
    assert json.loads((tmp_path / "r.json").read_text())["by_rule"] == {
        "NPU102": {"name": "xformers-import", "count": 1, "where": [f"{where}:2"]},
        "NPU112": {"name": "xformers-call", "count": 2, "where": [f"{where}:6"]},
    }
    findings = json.loads(_npu_port(tmp_path, "scan", "--format", "json", "attend.py").stdout)["findings"]
    assert sorted((f["code"], f["line"], f["severity"]) for f in findings) == [
        ("NPU102", 2, "handled"),
        ("NPU112", 6, "handled"),
    ]
