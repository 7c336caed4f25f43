"""The benchmark scripts keep working (tiny sizes): they are what users run on real hardware."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..conftest import emulated_torch_npu

pytestmark = pytest.mark.slow  # each runs a benchmark script in its own process(es)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernel_check_reports_every_kernel_and_runs_the_emulated_npu_ones(monkeypatch):
    kernel_check = _load("kernel_check")
    monkeypatch.setattr(
        kernel_check,
        "CASES",
        {"tiny-padding": (2, 2, 2, 16, 16, 16, False, "key_padding"), "tiny-gqa": (1, 4, 2, 8, 8, 16, True, None)},
    )
    with emulated_torch_npu():
        rows = kernel_check.check(torch.device("cpu"), [torch.float16], repeats=1)
    by_kernel = {}
    for row in rows:
        by_kernel.setdefault(row["kernel"], []).append(row)
    for name in ("math", "sdpa", "chunked", "npu_fusion", "npu_fused_infer"):
        assert all(row.get("ok") for row in by_kernel[name]), by_kernel[name]
    assert all("refused" in row for row in by_kernel["xformers"] + by_kernel["flash_attn"])


@pytest.mark.e2e
def test_chunked_memory_writes_results_with_the_machine(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "chunked_memory.py"),
            "--seq",
            "256",
            "--kernels",
            "sdpa,chunked@1MiB,legacy",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "chunked_memory_cpu_float32_S256.json").read_text())
    assert report["machine"]["cores"] >= 1 and report["config"]["seq"] == 256
    rows = {(r["kernel"], json.dumps(r["options"])): r for r in report["rows"]}
    chunked = rows[("chunked", json.dumps({"max_bytes": 1 << 20}))]
    assert chunked["max_abs_diff_vs_sdpa"] < 1e-5 and "queries x" in chunked["plan"]
    assert all("error" not in r for r in report["rows"])


@pytest.mark.e2e
def test_redirect_overhead_runs_both_loops_in_their_own_processes(tmp_path):
    out = tmp_path / "redirect.json"
    command = [
        sys.executable,
        str(BENCHMARKS / "redirect_overhead.py"),
        "--rounds",
        "1",
        "--steps",
        "3",
        "--out",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1), result.stderr  # 1 = over the target, which 3 steps cannot judge
    report = json.loads(out.read_text())
    assert set(report["median_seconds"]) == {"cpu-written", "cuda-written, redirected"}
    assert report["same_final_loss"] is True
    assert (
        report["ratio"]
        == report["median_seconds"]["cuda-written, redirected"] / report["median_seconds"]["cpu-written"]
    )
    assert report["machine"]["device_name"].startswith("cpu: ") and report["machine"]["load_average"] is not None


@pytest.mark.e2e
def test_parallel_scaling_measures_the_bytes_the_analytic_figure_gives(tmp_path):
    out = tmp_path / "scaling.json"
    command = [sys.executable, str(BENCHMARKS / "parallel_scaling.py"), "--models", "tiny-wan", "--procs", "2"]
    command += ["--layouts", "ring 2,cfg 2", "--steps", "2", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["models"]["tiny-wan"]["rows"]
    assert [row["layout"] for row in rows] == ["ring 2", "cfg 2"]
    for row in rows:
        assert row["bytes_per_step_measured"] == row["bytes_per_step_analytic"] > 0, row["layout"]
        assert row["median_step_s"] > 0


def test_the_analytic_figures_of_parallel_scaling():
    scaling = _load("parallel_scaling")
    shapes = {"batch": 1, "tokens": 64, "heads": 4, "head_dim": 64, "calls_per_forward": 2}
    shapes.update(forwards_per_step=2, output_elements=1000)
    # Ulysses 2: 2 forwards x 2 calls x 4 all-to-alls of 1 x 32 x 4 x 64 floats, half of each sent
    assert scaling.analytic_bytes(shapes, 2, 1, False) == {
        "all_to_all": 2 * 2 * 4 * 32 * 4 * 64 * 4 / 2,
        "all_gather": 0,
    }
    # ring 2: k and v of 32 tokens x 4 heads x 64 to the one peer, per call; CFG: one output exchange per step
    assert scaling.analytic_bytes(shapes, 1, 2, True) == {"all_to_all": 0, "all_gather": 2 * 2 * 32 * 4 * 64 * 4 + 4000}
    assert scaling.diffusers_gather_bytes(shapes, 2, 2, False) == 2 * 1000 / 4 * 4 * 3


def test_dit_strategy_overhead_on_a_named_device_and_dtype(tmp_path):
    """The GPU check (benchmarks/gpu/run_gpu.sh) runs it with --device cuda --dtype float16: the pipelines move there
    and the images are compared on the host; the report names the device and dtype it measured."""
    out = tmp_path / "overhead.json"
    module = _load("dit_strategy_overhead")
    code = module.main(["--device", "cpu", "--dtype", "bfloat16", "--rounds", "1", "--steps", "1", "--warmup", "0",
                        "--out", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert code == (0 if report["passed"] else 1)
    assert report["dtype"] == "bfloat16" and report["machine"]["device"].startswith("cpu: ")
    assert report["max_abs_image_diff"] == 0.0  # the same SDPA kernel on both sides
    assert set(report["median_seconds"]) == {"AttnProcessor2_0", "npu-port sdpa"}


@pytest.mark.e2e
def test_diff_capture_times_three_modes_and_sizes_both_dumps(tmp_path):
    out = tmp_path / "diff_capture.json"
    command = [sys.executable, str(BENCHMARKS / "diff_capture.py"), "--models", "tiny-dit", "--rounds", "1"]
    command += ["--steps", "1", "--warmup", "0", "--threads", "1", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    row = report["models"]["tiny-dit"]
    medians = row["median_seconds"]
    assert set(medians) == {"plain", "stats", "full"} and all(s > 0 for s in medians.values())
    assert row["ratio_stats"] == medians["stats"] / medians["plain"]
    stats, full = row["dump"]["stats"], row["dump"]["full"]
    assert stats["records"] == full["records"] > 0  # the same run, the same records
    assert stats["tensors"] == 0 and full["tensors"] == full["records"] and full["shards"] >= 1
    assert full["bytes"] > stats["bytes"] > 0
    assert row["bytes_ratio_full_vs_stats"] == full["bytes"] / stats["bytes"]
    assert report["machine"]["device_name"].startswith("cpu: ") and report["threads"] == 1
