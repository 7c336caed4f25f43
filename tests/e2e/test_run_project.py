"""``npu-port run``: a CUDA-only project (tests/fixtures/cuda_project) fails as it is and runs unchanged under
``npu-port run --device cpu``, with outputs that match the same computations written for a CPU."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_port.infer.models import tiny_model_dir
from npu_port.scan.engine import scan

#: The project runs a text-to-image pipeline built with the diffusers extra's API (transformers' CLIP included); the
#: compatibility matrix covers `npu-port run` under old diffusers in tests/integrations/test_diffusers_compat.py.
pytestmark = pytest.mark.diffusers_min("0.27")

REPO = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).parents[1] / "fixtures" / "cuda_project"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the project, a tiny pipeline directory for it, and an environment without npu-port's hooks."""
    root = tmp_path_factory.mktemp("cuda-project")
    shutil.copytree(PROJECT, root / "project")
    cache = root / "cache"
    saved = os.environ.get("NPU_PORT_CACHE_DIR")
    os.environ["NPU_PORT_CACHE_DIR"] = str(cache)
    try:
        shutil.copytree(tiny_model_dir("tiny"), root / "pipeline")
    finally:
        if saved is None:
            os.environ.pop("NPU_PORT_CACHE_DIR")
        else:
            os.environ["NPU_PORT_CACHE_DIR"] = saved
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(NPU_PORT_CACHE_DIR=str(cache), FIXTURE_PORT=str(_free_port()), PYTHONWARNINGS="ignore")
    return root, env


def _run(command, project, env, timeout=600):
    root, _ = project
    return subprocess.run(command, cwd=root / "project", env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.e2e
@pytest.mark.slow
def test_without_npu_port_the_project_fails(project):
    root, env = project
    result = _run([sys.executable, "main.py", "--out", str(root / "plain.pt"), "--pipeline", str(root / "pipeline")],
                  project, env)  # fmt: skip
    assert result.returncode != 0
    assert "ModuleNotFoundError: No module named 'xformers'" in result.stderr  # the first CUDA-only import
    assert not (root / "plain.pt").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_under_npu_port_run_it_runs_unchanged_and_matches_the_cpu_reference(project):
    root, env = project
    report_path = root / "run-report.json"
    ours = _run(
        [sys.executable, "-m", "npu_port", "run", "--device", "cpu", "--report", str(report_path), "main.py",
         "--out", str(root / "ours.pt"), "--pipeline", str(root / "pipeline")],
        project,
        {**env, "FIXTURE_PORT": str(_free_port())},
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr[-4000:]
    reference = _run(
        [sys.executable, "reference_cpu.py", "--out", str(root / "reference.pt"), "--pipeline", str(root / "pipeline")],
        project,
        env,
    )
    assert reference.returncode == 0, reference.stderr[-4000:]
    got, expected = torch.load(root / "ours.pt"), torch.load(root / "reference.pt")
    tolerances = {
        "flash_causal_gqa": 1e-5,
        "flash_varlen": 1e-5,
        "xformers_block_causal": 1e-5,
        "legacy_attention": 1e-5,
        "alt_corr": 1e-4,
        "pipeline_image": 2e-3,
        "all_reduce": 0.0,
    }
    for name, tolerance in tolerances.items():
        assert got[name].shape == expected[name].shape, name
        assert (got[name].double() - expected[name].double()).abs().max().item() <= tolerance, name
    assert got["peak_memory"].item() == 0  # torch.cuda.max_memory_allocated on a CPU: no device allocator

    report = json.loads(report_path.read_text())
    assert report["device"] == "cpu" and report["exit_code"] == 0
    assert set(report["drop_ins"]["served"]) == {"flash_attn", "xformers"}
    assert "alt_cuda_corr" in report["fallbacks"]["served"]
    assert report["legacy_attention_classes"] == ["models.attention.FullyFrameAttention"]
    hits = report["redirect"]["hits"]
    for entry in ("Tensor.cuda", "Module.cuda", "torch.randn", "torch.Generator", "init_process_group"):
        assert hits.get(entry, 0) > 0, entry
    assert report["strategy"]["requested"] == "auto"
    # what run handled, by rule, is what npu-port scan calls handled in the project (every handled finding is reached)
    scanned = scan([str(root / "project")])
    assert set(report["by_rule"]) == {f.code for f in scanned.findings if f.severity == "handled"}
    assert report["by_rule"]["NPU103"] == {
        "name": "cuda-extension-fallback",
        "count": 1,
        "where": [f"{root / 'project' / 'models' / 'corr.py'}:3"],  # the module that imported alt_cuda_corr
    }
