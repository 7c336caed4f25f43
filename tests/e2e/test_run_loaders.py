"""``npu-port run`` on a LoRA-style project written for a GPU (tests/fixtures/loaders_project): safetensors'
``load_file(..., device="cuda")``, ``torch.load(..., map_location="cuda")``, a pinning ``DataLoader`` and
``from_pretrained(..., device_map={"": torch.cuda.current_device()})``. It fails as it is, and runs unchanged under
``npu-port run --device cpu`` with the outputs of the same code written for the cpu; the report books each handled
line scan lists, at that line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_port.scan.engine import scan

PROJECT = Path(__file__).parents[1] / "fixtures" / "loaders_project"
#: main.py written for the cpu: each CUDA device it names, and how often it names it.
FOR_THE_CPU = {
    'device="cuda"': ('device="cpu"', 2),
    'map_location="cuda"': ('map_location="cpu"', 1),
    "batch.cuda(non_blocking=True)": ("batch", 1),
    '{"": torch.cuda.current_device()}': ('{"": "cpu"}', 1),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("loaders") / "project"
    shutil.copytree(PROJECT, root)
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE", "PYTHONPATH")}
    env.update(PYTHONWARNINGS="ignore", NPU_PORT_CACHE_DIR=str(root.parent / "cache"))
    made = _run([sys.executable, "make_inputs.py", "inputs"], root, env)
    assert made.returncode == 0, made.stderr[-3000:]
    source = (root / "main.py").read_text()
    for cuda, (cpu, times) in FOR_THE_CPU.items():
        assert source.count(cuda) == times, cuda
        source = source.replace(cuda, cpu)
    assert "cuda" not in source
    (root / "main_cpu.py").write_text(source)
    return root, env


def _run(command, cwd, env):
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
@pytest.mark.slow
def test_without_npu_port_the_first_cuda_load_fails(project):
    root, env = project
    plain = _run([sys.executable, "main.py", "inputs", "out.pt"], root, env)
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines()[-1] == (
        "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator is "
        "available on this system."
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_under_npu_port_run_it_gives_what_the_cpu_written_code_gives(project):
    root, env = project
    reference = _run([sys.executable, "main_cpu.py", "inputs", "reference.pt"], root, env)
    assert reference.returncode == 0, reference.stderr[-3000:]
    ours = _run(
        [
            sys.executable,
            "-m",
            "npu_port",
            "run",
            "--device",
            "cpu",
            "--report",
            "r.json",
            "main.py",
            "inputs",
            "out.pt",
        ],
        root,
        env,
    )
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert ours.stdout == reference.stdout == "merged (6, 8), projected (10, 6), logits (1, 8, 50)\n"
    got, expected = torch.load(root / "out.pt"), torch.load(root / "reference.pt")
    assert got.keys() == expected.keys() == {"merged", "projected", "logits"}
    for name in expected:
        assert got[name].dtype == expected[name].dtype == torch.float32
        assert torch.equal(got[name], expected[name]), name

    report = json.loads((root / "r.json").read_text())
    handled = {}
    for finding in scan([str(root / "main.py")]).findings:
        if finding.severity == "handled":
            handled.setdefault(finding.code, set()).add(f"{root / 'main.py'}:{finding.line}")
    assert {code: set(item["where"]) for code, item in report["by_rule"].items()} == handled
    assert set(handled) == {"NPU301", "NPU304", "NPU310"}
    hits = report["redirect"]["hits"]
    assert hits["load_file"] == 1  # mapped at the project's line: safetensors never stages through pinned memory
    assert hits["pin_memory=True -> False (cpu target)"] == 1  # the DataLoader
    assert hits["from_pretrained (ordinal or automatic map -> cpu)"] == 1
