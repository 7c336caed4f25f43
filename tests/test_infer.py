"""``npu-port infer`` / ``scripts/inference_npu.py``: an image and an honest report on a fresh machine, --compare
proving a port faithful (and failing when it is not), models from directories, and one clear line for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from npu_port.cli.main import main
from npu_port.infer import GenerationRequest, generate, load_pipeline
from npu_port.infer.models import tiny_model_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("npu-port-models")


@pytest.fixture
def model_cache(_module_cache, monkeypatch):
    """One npu-port cache for the module (over conftest's per-test one), so the tiny models are built once."""
    monkeypatch.setenv("NPU_PORT_CACHE_DIR", str(_module_cache))
    return _module_cache


def infer(tmp_path, *arguments: str) -> int:
    return main(["infer", "--no-progress", "--steps", "4", "--output", str(tmp_path / "out.png"), *arguments])


def report(tmp_path) -> dict:
    return json.loads((tmp_path / "out.json").read_text())


def test_default_run_writes_an_image_and_a_report(model_cache, tmp_path, capsys):
    assert infer(tmp_path) == 0
    image = Image.open(tmp_path / "out.png")
    assert image.size == (64, 64) and image.mode == "RGB"
    data = report(tmp_path)
    assert data["device"] == "cpu" and data["dtype"] == "float32"
    assert data["model"] == {
        "requested": "tiny",
        "source": str(model_cache / "models" / "tiny-v2"),
        "kind": "text-to-image",
        "random_weights": True,
    }
    assert set(data["versions"]) >= {"torch", "torch_npu", "diffusers", "npu_port"}
    assert data["strategy"]["requested"] == "auto" and data["strategy"]["resolved"]
    assert "strategy auto (select: measure" in data["strategy"]["explanation"]
    timing = data["time"]
    assert len(timing["steps_after_first_s"]) == 3  # 4 steps: the first is reported apart
    assert timing["first_step_s"] > 0 and timing["total_s"] >= timing["first_step_s"] + sum(
        timing["steps_after_first_s"]
    )
    assert data["peak_memory"]["bytes"] > 0 and "cpu" in data["peak_memory"]["what"]
    out = capsys.readouterr()
    assert "random weights" in out.err
    assert f"image: {tmp_path / 'out.png'}; report: {tmp_path / 'out.json'}" in out.out


def test_compare_passes_on_the_tiny_model(model_cache, tmp_path, capsys):
    assert infer(tmp_path, "--compare", "vanilla,sdpa,chunked,auto") == 0
    data = report(tmp_path)["comparison"]
    assert list(data["strategies"]) == ["vanilla", "sdpa", "chunked", "auto"]
    assert data["reference"] == "vanilla" and data["diverged"] == []
    for entry in data["strategies"].values():
        assert entry["max_abs_diff"] <= data["tolerance"] == 2e-3
    assert data["strategies"]["vanilla"]["max_abs_diff"] == 0 and data["strategies"]["vanilla"]["psnr_db"] is None
    assert "all within 0.002 of vanilla" in capsys.readouterr().out
    for name in ("vanilla", "sdpa", "chunked", "auto"):
        assert (tmp_path / f"out-{name}.png").is_file()


def test_compare_fails_when_a_strategy_diverges_beyond_tolerance(model_cache, tmp_path, capsys):
    # sdpa differs from vanilla by float32 rounding (~1e-6): a zero tolerance must call that out, with exit code 1
    assert infer(tmp_path, "--compare", "vanilla,sdpa", "--tolerance", "0") == 1
    assert "DIVERGED beyond 0 from vanilla: sdpa" in capsys.readouterr().out
    assert report(tmp_path)["comparison"]["diverged"] == ["sdpa"]


def test_a_saved_pipeline_directory_loads_with_model_dir(model_cache, tmp_path):
    directory = tmp_path / "my-pipeline"
    shutil.copytree(tiny_model_dir("tiny"), directory)
    assert infer(tmp_path, "--model", str(directory), "--seed", "3") == 0
    data = report(tmp_path)
    assert data["model"]["source"] == str(directory) and data["model"]["random_weights"] is False


def test_class_conditional_dit(model_cache, tmp_path):
    assert infer(tmp_path, "--model", "tiny-dit", "--class", "3") == 0
    data = report(tmp_path)
    assert data["model"]["kind"] == "class-conditional" and data["request"]["class_label"] == 3
    assert Image.open(tmp_path / "out.png").size == (16, 16)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--model", "./no/such/pipeline"], "npu-port: model directory './no/such/pipeline' does not exist; give a "),
        (["--steps", "0"], "npu-port: steps must be between 1 and 200, got 0"),
        (["--height", "65"], "npu-port: height must be a multiple of 2 between 2 and 2048 for this model, got 65"),
        (["--width", "4096"], "npu-port: width must be a multiple of 2 between 2 and 2048 for this model, got 4096"),
        (["--model", "tiny-dit", "--height", "32"], "npu-port: height 32: this class-conditional DiT makes 16x16"),
        (
            ["--model", "tiny-dit", "--class", "1000"],
            "npu-port: class must be between 0 and 999 for this model, got 1000",
        ),
        (["--strategy", "sdpa", "--profile", "ascend-910b"], "npu-port: give --strategy or --profile, not both"),
        (["--strategy", "fastest"], "npu-port: unknown attention strategy 'fastest'"),
        (["--device", "gpu"], "npu-port: unknown device 'gpu' (argument); valid devices: auto, npu, cuda"),
        (["--model", "tiny-dit", "--text-encoder-device", "cpu"], "npu-port: --text-encoder-device: 'tiny-dit' is"),
    ],
)
def test_bad_input_is_one_clear_line(model_cache, tmp_path, capsys, arguments, message):
    assert infer(tmp_path, *arguments) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out.png").exists()


def test_a_directory_that_is_not_a_pipeline(model_cache, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert infer(tmp_path, "--model", str(tmp_path / "empty")) == 2
    assert "is not a diffusers pipeline directory (no model_index.json in it)" in capsys.readouterr().err


def test_a_hub_id_offline_gives_one_line(model_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert infer(tmp_path, "--model", "someone/not-cached-model") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "npu-port: model 'someone/not-cached-model' is not a local directory and could not be loaded from the hub "
        "(offline (HF_HUB_OFFLINE=1): only locally cached files are used)"
    )


def test_profile_applies_its_strategy_and_reports_the_npu_options(model_cache, tmp_path):
    assert infer(tmp_path, "--profile", "ascend-910b") == 0
    data = report(tmp_path)
    assert data["strategy"]["requested"] == "ascend-910b"
    assert data["npu_options"]["dry_run"] is True and data["npu_options"]["reason"].startswith("no usable NPU")


def test_text_encoder_device_and_vae_switches_keep_the_image(model_cache):
    plain = load_pipeline("tiny", torch.device("cpu"), torch.float32, progress_bar=False)
    split = load_pipeline(
        "tiny", torch.device("cpu"), torch.float32, text_encoder_device=torch.device("cpu"), progress_bar=False
    )
    request = GenerationRequest(steps=3, strategy="sdpa")
    reference = generate(plain, request).image
    embedded = generate(split, request).image  # prompts encoded apart, only the embeddings passed to the pipeline
    sliced = generate(plain, GenerationRequest(steps=3, strategy="sdpa", vae_slicing=True)).image
    tiled = generate(plain, GenerationRequest(steps=3, strategy="sdpa", vae_tiling=True)).image
    np.testing.assert_array_equal(embedded, reference)
    np.testing.assert_allclose(sliced, reference, atol=1e-6)  # one image per batch: slicing changes nothing
    # the tiny VAE's tiles are 16 px, so the 64 px image really is decoded in blended tiles: close, not equal
    assert tiled.shape == reference.shape and 0 < np.abs(tiled - reference).max() < 1


def test_the_script_runs_on_a_fresh_cache(tmp_path):
    env = {**os.environ, "NPU_PORT_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "inference_npu.py"), "--no-progress", "--output", "img.png"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "npu-port: building the tiny model (random weights)" in result.stderr
    assert (tmp_path / "img.png").is_file() and json.loads((tmp_path / "img.json").read_text())["image"] == "img.png"


def test_the_cli_offers_the_dtypes_the_loader_knows():
    from npu_port.cli import infer_cmd
    from npu_port.infer import models

    assert infer_cmd.DTYPES == models.DTYPES  # listed twice so that --help never imports torch
