"""The ``npu-port`` command: version, and ``kernels`` explaining each unavailable kernel in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import npu_port
from npu_port.attn import kernel_names
from npu_port.attn.report import kernels_report
from npu_port.cli.main import main

from ..conftest import emulated_torch_npu


def _run_cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "npu_port", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.e2e
def test_version_in_a_fresh_process():
    result = _run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"npu-port {npu_port.__version__}"


@pytest.mark.e2e
@pytest.mark.slow
def test_kernels_lists_every_kernel_with_one_line_each():
    result = _run_cli("kernels")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.rstrip("\n").splitlines()
    assert lines[0].startswith(f"npu-port {npu_port.__version__} attention kernels on this machine (torch ")
    report = kernels_report()
    assert len(lines) == 1 + len(report["kernels"]) == 1 + len(kernel_names())
    for line, entry in zip(lines[1:], report["kernels"]):
        name, status = line.split()[:2]
        assert name == entry["name"]
        assert status == ("available" if entry["available"] else "unavailable")
        if not entry["available"]:
            assert entry["reasons"] and all(r["message"] in line for r in entry["reasons"])
    statuses = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert statuses["math"] == statuses["sdpa"] == statuses["chunked"] == "available"


def test_kernels_json_is_machine_readable(capsys):
    assert main(["kernels", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_name = {k["name"]: k for k in report["kernels"]}
    assert list(by_name) == kernel_names()
    assert by_name["npu_fused_infer"]["dtypes"] == ["float16", "bfloat16"]
    assert by_name["npu_fused_infer"]["supports"] == {"dropout": False, "grad": False, "float_mask": False}
    assert by_name["chunked"]["options"]["max_bytes"]["default"] is None
    for entry in report["kernels"]:
        assert entry["available"] == (entry["reasons"] == [])


def test_emulated_npu_without_a_device_is_explained(capsys):
    """torch_npu importing but no NPU visible is its own one-line reason."""
    with emulated_torch_npu():
        assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.split()[0] == "npu_fusion")
    assert "unavailable" in line and "no NPU is visible" in line


def test_verbose_shows_limits_and_options(capsys):
    assert main(["kernels", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "max head_dim: 768" in out and "option max_bytes=None" in out


@pytest.mark.e2e
def test_a_torch_that_cannot_import_is_diagnosed_not_dumped(tmp_path):
    """torch_npu without CANN breaks ``import torch`` itself; the CLI says what to do instead of a traceback."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise RuntimeError('Failed to load the backend extension: torch_npu. You can disable extension "
        "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.dirname(os.path.dirname(npu_port.__file__))]),
    }
    result = _run_cli("kernels", env=env)
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("npu-port: cannot import torch (RuntimeError: Failed to load the backend extension")
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stderr and "set_env.sh" in result.stderr
