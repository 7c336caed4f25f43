"""A RAFT-style project with its compiled extension's sources unbuilt on ``sys.path``
(tests/fixtures/raft_unbuilt_project): a run that never imports the extension says nothing about it; one that does
gets npu-port's fallback and one line saying the extension is not built — on stderr and in the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "raft_unbuilt_project"


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "raft"
    shutil.copytree(FIXTURE, root)
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(tmp_path / "cache"))
    return root, env


def _run(command, cwd, env):
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _npu_port_run(*arguments):
    return [sys.executable, "-m", "npu_port", "run", "--device", "cpu", *arguments]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_that_never_imports_the_extension_says_nothing_about_it(project):
    root, env = project
    printed = _run(_npu_port_run("flow.py"), root, env)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert printed.stdout == "grid: (1, 2, 3, 4)\n"
    assert "alt_cuda_corr" not in printed.stderr and "stand-ins served: none" in printed.stderr
    reported = _run(_npu_port_run("--report", "r.json", "flow.py"), root, env)
    assert reported.returncode == 0 and reported.stderr == ""
    fallbacks = json.loads((root / "r.json").read_text())["fallbacks"]
    assert fallbacks["served"] == {} and fallbacks["why"] == {}


@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_that_imports_it_gets_the_fallback_and_is_told_once_that_it_is_not_built(project):
    root, env = project
    plain = _run([sys.executable, "alternate.py"], root, env)
    assert plain.returncode == 1 and "AttributeError: module 'alt_cuda_corr' has no attribute 'forward'" in plain.stderr
    reason = f"not built ({root / 'alt_cuda_corr'} holds its unbuilt sources)"
    ours = _run(_npu_port_run("--report", "r.json", "alternate.py"), root, env)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == "corr: (1, 9, 4, 5)\n"
    assert ours.stderr == f"npu-port: alt_cuda_corr is {reason}; using npu-port's fallback\n"
    fallbacks = json.loads((root / "r.json").read_text())["fallbacks"]
    assert fallbacks["served"] == {"alt_cuda_corr": ["alt_cuda_corr"]}
    assert fallbacks["imported_by"] == {"alt_cuda_corr": {"alt_cuda_corr": "corr"}}
    assert fallbacks["why"] == {"alt_cuda_corr": reason}
