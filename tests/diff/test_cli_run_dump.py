"""``npu-port run --dump DIR script.py``: every module the user's script calls is recorded (named by class, as no
pipeline names them), one dump per rank under torchrun, and ``npu-port diff`` compares two such runs rank by rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npu_port.cli.main import main
from npu_port.diff import Dump

ROOT = Path(__file__).resolve().parents[2]

TORCH_SCRIPT = """\
import os
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
if os.environ.get("FLIP_GELU") == os.environ.get("RANK", "0"):
    model[1].approximate = "tanh"  # the defect: GELU's tanh form where the model was trained with erf
with torch.no_grad():
    print(float(model(torch.randn(2, 8)).sum()))
"""

DIT_SCRIPT = """\
from npu_port.integrations.diffusers.tiny import run_tiny_pipeline, tiny_dit_pipeline

run_tiny_pipeline(tiny_dit_pipeline(), steps=2)
"""


def _modules(dump: Dump):
    return {(r["module"], r["class"]) for r in dump.records()}


@pytest.mark.e2e
@pytest.mark.slow
def test_run_dump_records_a_scripts_modules_by_name(tmp_path):
    script = tmp_path / "tiny_model.py"
    script.write_text(TORCH_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "FLIP_GELU")}
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "npu_port.cli.main", "run", "--device", "cpu", "--dump", "run.d", script.name]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "npu-port run: dump run.d (8 records)" in done.stderr
    dump = Dump(tmp_path / "run.d")
    assert dump.complete and dump.meta["target"] == "process" and dump.meta["script"].endswith("tiny_model.py")
    assert _modules(dump) == {("Sequential", "Sequential"), ("Sequential.0", "Linear"), ("Sequential.1", "GELU"),
                              ("Sequential.2", "Linear")}  # fmt: skip
    records = list(dump.records())
    assert [(r["module"], r["io"]) for r in records[:2]] == [("Sequential", "in"), ("Sequential.0", "in")]
    assert records[-1]["module"] == "Sequential" and records[-1]["shape"] == [2, 4]


@pytest.mark.slow
def test_run_dump_of_a_pipeline_script_counts_denoising_steps(tmp_path, monkeypatch, capsys):
    script = tmp_path / "dit.py"
    script.write_text(DIT_SCRIPT)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--device", "cpu", "--dump", "dit.d", str(script)]) == 0
    dump = Dump(tmp_path / "dit.d")
    assert dump.meta["steps"] == 2
    modules = {m for m, _ in _modules(dump)}
    assert {
        "DiTTransformer2DModel.transformer_blocks.0.attn1",
        "AutoencoderKL.decoder.mid_block",
    } <= modules  # vae.decode is not forward: its decoder is named under the VAE all the same
    steps = {r["step"] for r in dump.records() if r["module"].startswith("DiTTransformer2DModel")}
    assert steps == {0, 1}
    assert "npu-port run: dump dit.d (" in capsys.readouterr().err


def _ranked_run(tmp_path, monkeypatch, folder: str, flip: str) -> Path:
    script = tmp_path / "tiny_model.py"
    script.write_text(TORCH_SCRIPT)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("FLIP_GELU", flip)
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        assert main(["run", "--device", "cpu", "--dump", str(tmp_path / folder), str(script)]) == 0
    return tmp_path / folder


@pytest.mark.slow
def test_rank_dumps_are_compared_rank_by_rank(tmp_path, monkeypatch, capsys):
    a = _ranked_run(tmp_path, monkeypatch, "a.d", flip="none")
    b = _ranked_run(tmp_path, monkeypatch, "b.d", flip="1")
    assert sorted(p.name for p in a.iterdir()) == ["rank-0", "rank-1"]
    assert Dump(a / "rank-1").meta["rank"] == 1 and Dump(a / "rank-1").meta["world_size"] == 2
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ranks"]["0"]["first_divergence"] is None
    first = report["ranks"]["1"]["first_divergence"]
    assert (first["module"], first["class"], first["origin"]) == ("Sequential.1", "GELU", True)
    assert report["first_divergence"]["rank"] == 1 and report["first_divergence"]["module"] == "Sequential.1"
    assert main(["diff", str(a), str(b)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rank 0: no divergence beyond tolerance")
    assert any(line.startswith("rank 1: first divergence: Sequential.1 (GELU), step -1, call 0:") for line in lines)
    assert lines[-1] == "overall: first divergence on rank 1: Sequential.1, step -1"
    assert main(["diff", str(a), str(a / "rank-0")]) == 2
    assert capsys.readouterr().err == (
        "npu-port: one side is a folder of per-rank dumps, the other a single dump; compare like with like\n"
    )
    monkeypatch.setenv("RANK", "0")
    assert main(["run", "--device", "cpu", "--dump", str(a), str(tmp_path / "tiny_model.py")]) == 2
    assert capsys.readouterr().err == (
        f"npu-port: {a / 'rank-0'} already exists: give a new folder for the dump (or remove that one)\n"
    )
