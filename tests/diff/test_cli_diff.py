"""``npu-port diff`` as users run it: a dump written by one process (``npu-port diff dump``) and compared in another
(this one), sides run now from specs (any strategy, a custom-processor strategy file included), and the exit codes:
0 no divergence, 1 a divergence named first, 2 bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_port.cli.main import main
from npu_port.diff import Dump
from tests.diff.scaled_processor import DoubledScaleProcessor, ExactProcessor, reference

ROOT = Path(__file__).resolve().parents[2]
FIRST_ATTENTION = "transformer.transformer_blocks.0.attn1"


@pytest.fixture(scope="module")
def dit_dir(tmp_path_factory) -> str:
    """The tiny DiT pipeline saved once as a local diffusers directory (``--model DIR``)."""
    from npu_port.integrations.diffusers.tiny import tiny_dit_pipeline

    folder = tmp_path_factory.mktemp("dit") / "tiny-dit"
    tiny_dit_pipeline(save_dir=str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def vanilla_dump(dit_dir, tmp_path_factory) -> Path:
    """Side A, written by another process: ``npu-port diff dump`` with the vanilla strategy."""
    out = tmp_path_factory.mktemp("machine-a") / "vanilla.d"
    env = {k: v for k, v in os.environ.items() if k not in ("NPU_PORT_DEVICE",)}
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    argv = ["diff", "dump", "--model", dit_dir, "--device", "cpu", "--strategy", "vanilla", "--steps", "2", "-o"]
    done = subprocess.run([sys.executable, "-m", "npu_port.cli.main", *argv, str(out), "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"dump: {out} (") and "strategy vanilla" in done.stdout
    return out


def _strategy_file(folder: Path, processor: type) -> Path:
    path = folder / f"{processor.__name__.lower()}.yaml"
    path.write_text(
        f"name: {processor.__name__.lower()}\nextends: custom-processor\n"
        f"processor: tests.diff.scaled_processor:{processor.__name__}\n"
    )
    return path


def _json(argv, capsys):
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_the_processors_compute_the_attention_they_say():
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    for processor in (ExactProcessor, DoubledScaleProcessor):
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=processor.factor * 8**-0.5)
        torch.testing.assert_close(got, reference(q, k, v, processor.factor))
    assert not torch.allclose(reference(q, k, v, 1.0), reference(q, k, v, 2.0), atol=1e-3)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dump_from_one_process_matches_sdpa_run_now_in_another(vanilla_dump, capsys):
    dump = Dump(vanilla_dump)
    assert dump.complete and dump.meta["strategy"] == "vanilla" and dump.meta["request"]["steps"] == 2
    assert dump.meta["strategy_resolved"] == "vanilla"  # known after the run (Capture.note)
    code, report = _json(["diff", str(vanilla_dump), "--b", "strategy=sdpa", "--json", "--no-progress"], capsys)
    assert code == 0, report["first_divergence"]
    assert report["first_divergence"] is None and report["divergent"] == []
    assert report["records_compared"] == dump.index["records"] and report["only_in_a"] == report["only_in_b"] == 0
    assert report["b"]["strategy"] == "sdpa" and report["b"]["request"] == dump.meta["request"]  # the dump's request
    assert report["b"]["strategy_resolved"] == "sdpa"


@pytest.mark.e2e
@pytest.mark.slow
def test_a_custom_processor_strategy_file_equal_to_vanilla_gives_no_divergence(vanilla_dump, tmp_path, capsys):
    strategy = _strategy_file(tmp_path, ExactProcessor)
    code = main(["diff", str(vanilla_dump), "--b", f"strategy={strategy}", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("no divergence beyond tolerance ("), out


@pytest.mark.e2e
@pytest.mark.slow
def test_a_custom_processor_with_a_changed_scale_is_named_first_as_origin(vanilla_dump, tmp_path, capsys):
    strategy = _strategy_file(tmp_path, DoubledScaleProcessor)
    argv = ["diff", str(vanilla_dump), "--b", f"strategy={strategy}", "--no-progress"]
    plot = tmp_path / "diff.png"
    code = main([*argv, "--plot", str(plot)])
    text = capsys.readouterr().out
    assert code == 1
    assert text.startswith(f"first divergence: {FIRST_ATTENTION} (Attention), step 0, call 0: error "), text
    assert "-- origin: its inputs match" in text.splitlines()[0]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, report = _json([*argv, "--json"], capsys)
    first = report["first_divergence"]
    assert code == 1 and (first["module"], first["step"], first["call"], first["origin"]) == (
        FIRST_ATTENTION,
        0,
        0,
        True,
    )
    assert first["error"] > first["tolerance"] == 1e-4
    code, report = _json([*argv, "--json", "--tolerance", "10"], capsys)  # a tolerance that accepts it
    assert code == 0 and report["first_divergence"] is None


@pytest.mark.e2e
@pytest.mark.slow
def test_two_spec_sides_run_now_and_kept(dit_dir, tmp_path, capsys):
    keep = tmp_path / "kept"
    argv = ["diff", "--model", dit_dir, "--steps", "1", "--device", "cpu", "--a", "strategy=vanilla",
            "--b", "strategy=sdpa,dtype=float32", "--keep", str(keep), "--json", "--no-progress"]  # fmt: skip
    code, report = _json(argv, capsys)
    assert code == 0 and report["first_divergence"] is None
    a, b = Dump(keep / "a.d"), Dump(keep / "b.d")
    assert (a.meta["strategy"], b.meta["strategy"]) == ("vanilla", "sdpa")
    assert a.meta["request"]["steps"] == b.meta["request"]["steps"] == 1
    assert main(argv) == 2  # the kept dumps are never written over
    assert capsys.readouterr().err == (
        f"npu-port: {keep / 'a.d'} already exists: give a new folder for the dump (or remove that one)\n"
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_two_dumps_in_a_bfloat16_run_diverge_at_float32_tolerance(vanilla_dump, tmp_path, capsys):
    out = tmp_path / "bf16.d"
    assert main(["diff", "dump", "--model", str(Dump(vanilla_dump).meta["model"]), "--device", "cpu", "--dtype",
                 "bfloat16", "--strategy", "sdpa", "--steps", "2", "-o", str(out), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    code, report = _json(["diff", str(vanilla_dump), str(out), "--json", "--tolerance", "1e-6"], capsys)
    assert code == 1 and report["first_divergence"]["module"].startswith("transformer.")
    assert report["b"]["dtype"] == "bfloat16"


def test_bisect_names_the_strategy_and_a_module_over_an_irrelevant_dtype_difference(dit_dir, tmp_path, capsys):
    """--bisect: B differs from A in strategy (a processor that doubles the scale) and in dtype (bfloat16, within its
    tolerance here): the strategy is named, narrowed to one attention module, in no more runs than the bound."""
    doubled = _strategy_file(tmp_path, DoubledScaleProcessor)
    argv = ["diff", "--model", dit_dir, "--device", "cpu", "--steps", "1", "--a", "strategy=vanilla",
            "--b", f"strategy={doubled},dtype=bfloat16", "--bisect", "--json", "--no-progress"]  # fmt: skip
    assert main(argv) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["diverged"] is True
    assert result["cause"] == {"setting": "strategy", "a": "vanilla", "b": str(doubled)}
    assert result["modules"] == [FIRST_ATTENTION]
    assert result["runs"] <= result["max_runs"]


def test_bisect_with_equivalent_sides_finds_nothing(dit_dir, capsys):
    argv = ["diff", "--model", dit_dir, "--device", "cpu", "--steps", "1", "--a", "strategy=vanilla",
            "--b", "strategy=sdpa", "--bisect", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("no divergence: B matches A (")
