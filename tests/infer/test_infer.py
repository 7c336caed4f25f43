"""``npu-port infer`` / ``scripts/inference_npu.py``: an image and an honest report on a fresh machine, --compare
proving a port faithful (and failing when it is not), models from directories, and one clear line for bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from npu_port.atomic import json_safe
from npu_port.cli.main import main
from npu_port.errors import InferenceError
from npu_port.infer import TINY_MODELS, GenerationRequest, compare_strategies, generate, load_pipeline
from npu_port.infer.models import tiny_model_dir

from .. import nan_attention

REPO = Path(__file__).resolve().parents[2]


def infer(tmp_path, *arguments: str) -> int:
    return main(["infer", "--no-progress", "--steps", "4", "--output", str(tmp_path / "out.png"), *arguments])


def strict_json(text: str):
    """JSON as the standard defines it: a bare NaN / Infinity (which json.dumps writes by default) is an error."""

    def refuse(constant):
        raise ValueError(f"not valid JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def report(tmp_path, name: str = "out.json") -> dict:
    return strict_json((tmp_path / name).read_text())


def assert_nothing_loaded() -> None:
    """This test's own (fresh) npu-port cache holds no built model: the run stopped before loading one."""
    assert not (Path(os.environ["NPU_PORT_CACHE_DIR"]) / "models").exists()


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
    assert data["finite"] is True and data["non_finite_values"] == 0 and data["disk_cache"] is True
    assert data["image"] == str(tmp_path / "out.png")
    assert data["image_sha256"] == hashlib.sha256((tmp_path / "out.png").read_bytes()).hexdigest()
    out = capsys.readouterr()
    assert "random weights" in out.err
    assert f"image: {tmp_path / 'out.png'}; report: {tmp_path / 'out.json'}" in out.out
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.png.lock", "out.json", "out.png"]  # no temporaries


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
        (["--steps", "0"], "npu-port: steps must be between 1 and 50, got 0"),
        (["--height", "65"], "npu-port: height must be a multiple of 2 between 2 and 128 for this model, got 65"),
        (["--width", "4096"], "npu-port: width must be a multiple of 2 between 2 and 128 for this model, got 4096"),
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
def test_bad_input_is_one_clear_line(tmp_path, capsys, arguments, message):
    assert infer(tmp_path, *arguments) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "out.png").exists()
    assert_nothing_loaded()


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


@pytest.mark.e2e
@pytest.mark.slow
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


# ------------------------------------------------------------------------------------------- failing closed on NaN


@pytest.fixture
def nan_strategy():
    with nan_attention.nan_strategy() as name:
        yield name


def test_compare_with_a_strategy_that_returns_nan_diverges(model_cache, tmp_path, capsys, nan_strategy):
    assert infer(tmp_path, "--compare", f"vanilla,{nan_strategy}", "--tolerance", "0.5") == 1
    out = capsys.readouterr().out
    assert "DIVERGED output not finite (NaN or inf): test-nan" in out
    assert "all within" not in out
    data = report(tmp_path)  # valid JSON: no bare NaN
    comparison = data["comparison"]
    assert comparison["diverged"] == ["test-nan"] and comparison["not_finite"] == ["test-nan"]
    entry = comparison["strategies"]["test-nan"]
    assert entry["finite"] is False and entry["non_finite_values"] == 64 * 64 * 3
    assert entry["max_abs_diff"] is None and entry["psnr_db"] is None
    assert entry["image"] is None and entry["image_sha256"] is None  # no black picture saved as if it were a result
    assert not (tmp_path / "out-test-nan.png").exists()
    assert data["images"] == [str(tmp_path / "out-vanilla.png")]
    vanilla = comparison["strategies"]["vanilla"]
    assert vanilla["finite"] is True and vanilla["max_abs_diff"] == 0
    assert vanilla["image_sha256"] == hashlib.sha256((tmp_path / "out-vanilla.png").read_bytes()).hexdigest()


def test_compare_with_a_nan_reference_diverges_everywhere(model_cache, tmp_path, capsys, nan_strategy):
    assert infer(tmp_path, "--compare", f"{nan_strategy},vanilla,sdpa") == 1
    out = capsys.readouterr().out
    assert (
        "DIVERGED: the reference test-nan's output was not finite (NaN or inf), so nothing can be compared with it: "
        "test-nan, vanilla, sdpa"
    ) in out
    comparison = report(tmp_path)["comparison"]
    assert comparison["diverged"] == ["test-nan", "vanilla", "sdpa"] and comparison["not_finite"] == ["test-nan"]
    assert comparison["strategies"]["vanilla"]["max_abs_diff"] is None


def test_a_single_run_with_a_non_finite_image_fails_closed(model_cache, tmp_path, capsys, nan_strategy):
    (tmp_path / "out.png").write_bytes(b"an earlier run's picture")  # must not pass for this run's
    assert infer(tmp_path, "--strategy", nan_strategy) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"npu-port: the image under strategy test-nan (resolved test-nan) is not finite ({64 * 64 * 3} of "
        f"{64 * 64 * 3} values are NaN or inf): no image written; report: {tmp_path / 'out.json'}"
    )
    data = report(tmp_path)
    assert data["finite"] is False and data["image"] is None and data["image_sha256"] is None
    assert not (tmp_path / "out.png").exists()


def _result(image: np.ndarray, name: str):
    from npu_port.infer.run import GenerationResult

    return GenerationResult(image, name, name, "", 0.1, [0.1], 0.2, {"bytes": 0, "what": "-"})


@given(
    data=st.data(),
    count=st.integers(2, 4),
    tolerance=st.floats(0, 1),
    bad=st.sampled_from([np.nan, np.inf, -np.inf]),
)
@settings(max_examples=60, deadline=None)
def test_a_non_finite_value_anywhere_is_a_divergence_whatever_the_tolerance(data, count, tolerance, bad):
    from npu_port.infer.compare import Comparison

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    base = rng.random((4, 4, 3), dtype=np.float32)
    images = [base + rng.uniform(-1e-4, 1e-4, base.shape).astype(np.float32) for _ in range(count)]
    broken = data.draw(st.integers(0, count - 1))
    images[broken][data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3)), data.draw(st.integers(0, 2))] = bad
    names = [f"s{i}" for i in range(count)]
    comparison = Comparison.measure({n: _result(im, n) for n, im in zip(names, images)}, tolerance)
    assert comparison.not_finite == [names[broken]]
    if broken == 0:
        assert comparison.diverged == names  # nothing can be compared with a non-finite reference
        assert "the reference s0's output was not finite" in comparison.verdict()
    else:
        assert names[broken] in comparison.diverged
        assert f"output not finite (NaN or inf): {names[broken]}" in comparison.verdict()
    assert comparison.verdict().startswith("DIVERGED")
    strict_json(json.dumps(json_safe(comparison.as_dict()), allow_nan=False))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.1"])
def test_tolerance_must_be_finite_and_not_negative(tmp_path, capsys, value):
    assert infer(tmp_path, "--compare", "vanilla,sdpa", f"--tolerance={value}") == 2
    shown = f"{float(value):g}"
    assert capsys.readouterr().err == f"npu-port: --tolerance must be a finite number >= 0, got {shown}\n"
    assert_nothing_loaded()


def test_compare_strategies_refuses_a_nan_tolerance_before_running(model_cache):
    loaded = load_pipeline("tiny", torch.device("cpu"), torch.float32, progress_bar=False)
    with pytest.raises(InferenceError, match=r"^tolerance must be a finite number >= 0, got nan$"):
        compare_strategies(loaded, GenerationRequest(steps=1), ["vanilla", "sdpa"], float("nan"))


# ------------------------------------------------------------------------------------------- checked before loading


@pytest.fixture
def not_a_folder(tmp_path):
    """A regular file: nothing can be created under it, even by root (chmod does not stop root)."""
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


def test_bad_paths_seeds_and_strategies_are_refused_before_loading(tmp_path, capsys, not_a_folder):
    (tmp_path / "folder").mkdir()
    out = str(tmp_path / "out.png")
    cases = [
        (["--output", str(tmp_path / "folder")], f"--output {str(tmp_path / 'folder')!r} is a folder; give an image"),
        (["--output", "x.txt"], "--output 'x.txt': '.txt' is not an image format npu-port can write; use one of: "),
        (["--output", str(tmp_path / "noext")], "it has no extension; use one of: "),
        (["--output", str(not_a_folder / "sub" / "o.png")], f"cannot write a file in {not_a_folder / 'sub'} ("),
        (["--report", out], f"--report {out!r} is the same file as --output; give another path"),
        (["--report", str(tmp_path / "folder")], "is a folder; give a file path"),
        (["--seed", str(2**70)], f"seed must be between 0 and {2**63 - 1}, got {2**70}"),
        (["--seed", "-1"], f"seed must be between 0 and {2**63 - 1}, got -1"),
        (["--guidance-scale", "nan"], "guidance scale must be a finite number >= 0, got nan"),
        (["--compare", "vanilla,my.yaml"], "strategy file 'my.yaml' does not exist; give a strategy YAML file that "),
        (["--compare", "vanilla,nope"], "unknown attention strategy 'nope'; valid strategies: auto, chunked, "),
        (["--compare", "vanilla,npu"], "strategy 'npu' cannot run on this machine (npu_fused_infer: torch_npu is"),
        (["--compare", "vanilla"], "--compare needs at least two strategies separated by commas"),
        (["--strategy", "custom-processor"], "strategy 'custom-processor' needs a processor class"),
        (["--strategy", "./missing/strategy.yaml"], "strategy file './missing/strategy.yaml' does not exist"),
        (["--tolerance", "0.1"], "--tolerance applies to --compare only"),
        (["--text-encoder-device", "gpu"], "unknown device 'gpu' (argument); valid devices:"),
        (["--width", "256"], "width must be a multiple of 2 between 2 and 128 for this model, got 256"),
        (["--model", "tiny-dit", "--steps", "201"], "steps must be between 1 and 200, got 201"),
    ]
    for arguments, message in cases:
        assert infer(tmp_path, *arguments) == 2, arguments
        err = capsys.readouterr().err
        assert err.startswith("npu-port: ") and message in err and err.count("\n") == 1, (arguments, err)
    if os.path.isdir("/sys"):  # a folder even root cannot create files in: the probe really tries
        assert infer(tmp_path, "--output", "/sys/npu-port-test.png") == 2
        assert capsys.readouterr().err == (
            "npu-port: --output '/sys/npu-port-test.png': cannot write a file in /sys (Permission denied)\n"
        )
    assert_nothing_loaded()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "folder"]


def test_the_valid_extensions_are_those_pil_writes(model_cache, tmp_path, capsys):
    from npu_port.infer.paths import image_formats

    assert {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif"} <= set(image_formats())
    assert not {".txt", ".json", ".xbm", ".msp"} & set(image_formats())  # .xbm/.msp: 1-bit only, not RGB
    assert infer(tmp_path, "--output", str(tmp_path / "out.jpg"), "--steps", "2") == 0
    assert Image.open(tmp_path / "out.jpg").format == "JPEG"
    assert report(tmp_path)["image_sha256"] == hashlib.sha256((tmp_path / "out.jpg").read_bytes()).hexdigest()


def _config_only_copy(model: str, destination: Path) -> Path:
    """A pipeline directory with the built model's config JSON files and no weights: loading it would fail."""
    source = tiny_model_dir(model)
    for config in source.rglob("*.json"):
        target = destination / config.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(config, target)
    return destination


def test_a_local_directorys_limits_come_from_its_configs_before_loading(model_cache, tmp_path, capsys):
    dit = str(_config_only_copy("tiny-dit", tmp_path / "dit"))
    text2image = str(_config_only_copy("tiny", tmp_path / "sd"))
    capsys.readouterr()  # building the tiny models on first use (this test may be a worker's first) prints progress
    cases = [
        ([dit, "--height", "32"], "height 32: this class-conditional DiT makes 16x16 images only"),
        ([dit, "--class", "1000"], "class must be between 0 and 999 for this model, got 1000"),
        ([dit, "--text-encoder-device", "cpu"], f"--text-encoder-device: {dit!r} is class-conditional"),
        ([text2image, "--height", "63"], "height must be a multiple of 2 between 2 and 2048 for this model, got 63"),
        ([text2image, "--steps", "201"], "steps must be between 1 and 200, got 201"),  # general bounds: not built-in
    ]
    for arguments, message in cases:
        assert infer(tmp_path, "--model", *arguments) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # the same directory with a valid request gets as far as loading, which fails: it has no weights
    assert infer(tmp_path, "--model", dit) == 2
    assert f"npu-port: cannot load the pipeline in {dit!r}" in capsys.readouterr().err


def test_the_builtin_limits_match_the_built_models(model_cache):
    from npu_port.infer.limits import BUILTIN_LIMITS, directory_limits

    for name in TINY_MODELS:
        from_configs = directory_limits(str(tiny_model_dir(name)))
        builtin = BUILTIN_LIMITS[name]
        fields = ("kind", "factor", "native_size", "classes", "frame_factor", "encoder_apart")
        assert [getattr(builtin, f) for f in fields] == [getattr(from_configs, f) for f in fields], name
        loaded = load_pipeline(name, torch.device("cpu"), torch.float32, progress_bar=False)
        assert loaded.limits == builtin and loaded.kind == builtin.kind
    assert (BUILTIN_LIMITS["tiny"].max_side, BUILTIN_LIMITS["tiny"].max_steps) == (128, 50)


def test_an_unwritable_cache_dir_set_explicitly_is_an_error(tmp_path, capsys, monkeypatch, not_a_folder):
    for folder, reason in ((not_a_folder / "cache", "Not a directory"), (Path("/sys/npu-port-cache"), None)):
        if reason is None and not os.path.isdir("/sys"):
            continue
        monkeypatch.setenv("NPU_PORT_CACHE_DIR", str(folder))
        assert infer(tmp_path) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"npu-port: NPU_PORT_CACHE_DIR={folder}: cannot write there (") and err.count("\n") == 1
        assert "set it to a folder you can write, or unset it" in err and (reason is None or reason in err)
    assert not (tmp_path / "out.png").exists()


def test_an_unwritable_default_cache_warns_and_runs_without_a_disk_cache(tmp_path, capsys, monkeypatch, not_a_folder):
    monkeypatch.delenv("NPU_PORT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    assert infer(tmp_path, "--steps", "2") == 0
    err = capsys.readouterr().err
    warnings_given = [line for line in err.splitlines() if "warning" in line]
    assert warnings_given == [
        f"npu-port: warning: cannot write the cache folder {not_a_folder / 'npu-port'} (Not a directory); running "
        "without a disk cache (auto measures again, built-in models are built in a temporary folder); set "
        "NPU_PORT_CACHE_DIR to a writable folder"
    ]
    assert "building the tiny model" in err
    data = report(tmp_path)
    assert data["disk_cache"] is False and data["model"]["source"].startswith(tempfile.gettempdir())
    assert (tmp_path / "out.png").is_file()


# ------------------------------------------------------------------------------------------- writing the outputs


def _script(*arguments: str, cache: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "inference_npu.py"), "--no-progress", *arguments],
        cwd=cwd,
        env={**os.environ, "NPU_PORT_CACHE_DIR": str(cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C as in a terminal
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_three_runs_with_the_same_output_leave_one_consistent_pair(model_cache, tmp_path):
    tiny_model_dir("tiny")  # built once, before the race
    small = ("--steps", "2", "--height", "32", "--width", "32", "--strategy", "sdpa", "--output", "out.png")
    runs = [_script(*small, "--seed", str(seed), cache=model_cache, cwd=tmp_path) for seed in (1, 2, 3)]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    data = report(tmp_path)
    image = (tmp_path / "out.png").read_bytes()
    assert data["image_sha256"] == hashlib.sha256(image).hexdigest()  # the image is the report's run's
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.png.lock", "out.json", "out.png"]  # no temporaries


def test_the_three_seeds_of_the_race_make_different_images(model_cache):
    """So the race above could fail: a report beside another run's image would not match its sha256."""
    loaded = load_pipeline("tiny", torch.device("cpu"), torch.float32, progress_bar=False)
    images = [
        generate(loaded, GenerationRequest(steps=2, height=32, width=32, seed=seed, strategy="sdpa")).image
        for seed in (1, 2, 3)
    ]
    for first, second in ((0, 1), (1, 2), (0, 2)):
        assert np.abs(images[first] - images[second]).max() > 0.01


@pytest.mark.e2e
@pytest.mark.slow
def test_ctrl_c_during_a_run_exits_130_with_one_line_and_writes_nothing(model_cache, tmp_path):
    tiny_model_dir("tiny")
    slow = ("--steps", "50", "--height", "128", "--width", "128", "--strategy", "vanilla", "--output", "out.png")
    run = _script(*slow, cache=model_cache, cwd=tmp_path)
    lines = []
    for line in run.stderr:  # the random-weights note comes once the model is loaded, just before the compute
        lines.append(line)
        if "random weights" in line:
            break
    time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    out, rest = run.communicate(timeout=120)
    assert run.returncode == 130, (lines, rest)
    assert rest == "npu-port: interrupted (Ctrl-C); nothing was written\n"
    assert out == ""
    assert not (tmp_path / "out.png").exists() and not (tmp_path / "out.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_ctrl_c_while_the_pair_is_written_is_held_back_until_it_is_whole(tmp_path):
    from npu_port.infer.saving import write_set

    class CtrlCWhileSerialised:
        """Sends this process SIGINT when the report is being serialised, i.e. after the images were written."""

        def __str__(self) -> str:
            os.kill(os.getpid(), signal.SIGINT)
            return "interrupted here"

    written = []
    images = {tmp_path / "a.png": b"image bytes", tmp_path / "b.png": b"more bytes"}
    with pytest.raises(KeyboardInterrupt):
        write_set(images, tmp_path / "r.json", {"value": CtrlCWhileSerialised()}, tmp_path / ".lock", written)
    assert written == [*images, tmp_path / "r.json"]  # the whole set, then the Ctrl-C
    assert json.loads((tmp_path / "r.json").read_text()) == {"value": "interrupted here"}
    assert all(path.read_bytes() == data for path, data in images.items())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_the_deadline_stops_a_request_between_steps_and_restores_the_strategy(model_cache):
    from npu_port.infer import Deadline, RequestTimeout

    loaded = load_pipeline("tiny", torch.device("cpu"), torch.float32, progress_bar=False)
    before = {name: type(p) for name, p in loaded.pipe.unet.attn_processors.items()}
    with pytest.raises(RequestTimeout) as caught:
        generate(loaded, GenerationRequest(steps=20, strategy="sdpa"), deadline=Deadline(1e-4))
    assert re.fullmatch(
        r"the request ran past its time limit of 0\.0001 s and was stopped \(after \d+\.\d s, at step 1 of 20 under "
        r"strategy 'sdpa'\); ask for fewer steps or a smaller image",
        str(caught.value),
    )
    assert {name: type(p) for name, p in loaded.pipe.unet.attn_processors.items()} == before
    assert generate(loaded, GenerationRequest(steps=2, strategy="sdpa"), deadline=Deadline(600)).finite
    with pytest.raises(InferenceError, match=r"^request timeout must be a finite number of seconds > 0, got nan$"):
        Deadline(float("nan"))
