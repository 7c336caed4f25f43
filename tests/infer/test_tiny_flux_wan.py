"""``npu-port infer --model tiny-flux`` / ``--model tiny-wan``: the built-in Flux and Wan pipelines have a real model's
head shape and a context-parallel plan, split evenly over up to 8 ranks at their default size, run classifier-free
guidance as two transformer calls a step (conditional, then unconditional), and write an image, an mp4 or a video's
frames with the report — or refuse bad input (``--frames``, mp4 without its writer) in one line before any load."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from npu_port._optional import extra_hint
from npu_port.infer import GenerationRequest, generate, load_pipeline
from npu_port.infer.limits import BUILTIN_LIMITS, TEXT_TO_IMAGE, TEXT_TO_VIDEO
from npu_port.infer.models import tiny_model_dir

from .test_infer import assert_nothing_loaded, infer, report

pytestmark = pytest.mark.diffusers_min("0.36")  # Wan's and Flux's context-parallel plans

PROMPT = GenerationRequest().prompt


def _load(name: str):
    return load_pipeline(name, torch.device("cpu"), torch.float32, progress_bar=False)


def _transformer_calls(pipe, monkeypatch):
    """Every call of the pipeline's transformer, as its keyword arguments (the pipelines pass all by keyword)."""
    calls = []
    forward = pipe.transformer.forward

    def spy(*args, **kwargs):
        assert not args
        calls.append(kwargs)
        return forward(**kwargs)

    monkeypatch.setattr(pipe.transformer, "forward", spy)
    return calls


# ------------------------------------------------------------------------------------------- the built models


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-wan"])
def test_the_transformers_have_real_heads_and_a_context_parallel_plan(model_cache, name):
    loaded = _load(name)
    transformer = loaded.pipe.transformer
    config = transformer.config
    assert (config.num_attention_heads, config.attention_head_dim) == (4, 64)
    assert type(transformer)._cp_plan  # diffusers' context-parallel plan: what enable_parallelism splits
    heads = [module.heads for module in transformer.modules() if hasattr(module, "heads")]
    assert heads and set(heads) == {4}
    if name == "tiny-flux":
        assert config.axes_dims_rope == [16, 24, 24] and config.guidance_embeds is False
        assert (config.num_layers, config.num_single_layers) == (1, 1)
        assert loaded.pipe.vae.config.latent_channels == 16
    else:
        assert config.num_layers == 2 and list(config.patch_size) == [1, 2, 2]
        assert loaded.pipe.vae.config.z_dim == 16 and loaded.pipe.vae_scale_factor_temporal == 4
    assert loaded.limits == BUILTIN_LIMITS[name]


def _encoded(loaded, prompt: str):
    """What the pipeline's own text encoders make of ``prompt`` (the tokens the transformer cross-attends to)."""
    pipe, length = loaded.pipe, loaded.limits.call_defaults["max_sequence_length"]
    with torch.no_grad():
        if loaded.kind == TEXT_TO_VIDEO:
            return pipe.encode_prompt(prompt, do_classifier_free_guidance=False, max_sequence_length=length)[0]
        return pipe.encode_prompt(prompt, None, max_sequence_length=length)[0]


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-wan"])
def test_each_step_calls_the_transformer_twice_cond_then_uncond_on_sequences_split_by_8(model_cache, monkeypatch, name):
    loaded = _load(name)
    calls = _transformer_calls(loaded.pipe, monkeypatch)
    generate(loaded, GenerationRequest(steps=3, strategy="sdpa"))  # the default guidance scale, 4
    assert len(calls) == 6
    positive, negative = _encoded(loaded, PROMPT), _encoded(loaded, "")
    for step in range(3):
        cond, uncond = calls[2 * step], calls[2 * step + 1]
        torch.testing.assert_close(cond["encoder_hidden_states"], positive, rtol=0, atol=0)
        torch.testing.assert_close(uncond["encoder_hidden_states"], negative, rtol=0, atol=0)
        torch.testing.assert_close(cond["hidden_states"], uncond["hidden_states"], rtol=0, atol=0)
    # the token counts context parallelism splits, at the default size: both divisible by 8
    hidden, text = calls[0]["hidden_states"], calls[0]["encoder_hidden_states"]
    if name == "tiny-flux":
        assert hidden.shape == (1, 64, 64)  # 128 px / 8 (VAE) / 2 (packing) = 8 x 8 tokens of 16 x 2 x 2 channels
        image_tokens = hidden.shape[1]
    else:
        assert hidden.shape == (1, 16, 2, 8, 8)  # 5 frames -> 2 latent frames of 8 x 8; patches of 1 x 2 x 2
        image_tokens = 2 * (8 // 2) * (8 // 2)
    assert text.shape[1] == 32
    assert image_tokens % 8 == 0 and text.shape[1] % 8 == 0


def test_without_guidance_each_step_calls_the_transformer_once(model_cache, monkeypatch):
    loaded = _load("tiny-flux")
    calls = _transformer_calls(loaded.pipe, monkeypatch)
    generate(loaded, GenerationRequest(steps=2, strategy="sdpa", guidance_scale=1.0))
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-wan"])
def test_the_same_seed_gives_the_same_output(model_cache, name):
    loaded = _load(name)
    first, again, other = (
        generate(loaded, GenerationRequest(steps=2, seed=seed, strategy="sdpa")).image for seed in (5, 5, 6)
    )
    np.testing.assert_array_equal(first, again)
    assert np.abs(first - other).max() > 0.01
    assert first.shape == ((128, 128, 3) if name == "tiny-flux" else (5, 64, 64, 3))


# ------------------------------------------------------------------------------------------- the command


def test_tiny_flux_writes_an_image_and_a_report(model_cache, tmp_path, capsys):
    assert infer(tmp_path, "--model", "tiny-flux", "--strategy", "sdpa") == 0
    data = report(tmp_path)
    assert data["model"]["kind"] == TEXT_TO_IMAGE and data["model"]["requested"] == "tiny-flux"
    assert data["image_size"] == [128, 128] and "frames" not in data
    image = tmp_path / "out.png"
    assert Image.open(image).size == (128, 128)
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    assert data["image_sha256"] == digest and data["files"] == [{"path": str(image), "sha256": digest}]
    assert f"image: {image}; report: {tmp_path / 'out.json'}" in capsys.readouterr().out


def test_tiny_wan_writes_its_frames_and_a_report(model_cache, tmp_path, capsys):
    # an earlier, longer video's frames with the same name must not pass for this run's; other files stay
    for leftover in ("out-005.png", "out-012.png", "out-x.png", "out-1.png"):
        (tmp_path / leftover).write_bytes(b"an earlier run's frame")
    assert infer(tmp_path, "--model", "tiny-wan", "--strategy", "sdpa") == 0
    data = report(tmp_path)
    assert data["model"]["kind"] == TEXT_TO_VIDEO and data["frames"] == 5 and data["image_size"] == [64, 64]
    frames = [tmp_path / f"out-{index:03d}.png" for index in range(5)]
    assert data["files"] == [{"path": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in frames]
    assert data["image"] == str(frames[0]) and data["image_sha256"] == data["files"][0]["sha256"]
    assert all(Image.open(p).size == (64, 64) for p in frames)
    assert len({p.read_bytes() for p in frames}) == 5  # five different frames
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".out.png.lock", "out.json", "out-x.png", "out-1.png"] + [p.name for p in frames]
    )
    assert f"video (5 frames): {frames[0]} .. {frames[-1]} (5 files); report:" in capsys.readouterr().out


def test_tiny_wan_frames_option_and_compare_over_every_frame(model_cache, tmp_path):
    assert infer(tmp_path, "--model", "tiny-wan", "--frames", "9", "--steps", "2", "--compare", "vanilla,sdpa") == 0
    comparison = report(tmp_path)["comparison"]
    assert comparison["diverged"] == [] and comparison["strategies"]["sdpa"]["frames"] == 9
    assert 0 < comparison["strategies"]["sdpa"]["max_abs_diff"] <= comparison["tolerance"]  # rounding, not identity
    for name in ("vanilla", "sdpa"):
        assert [Path(f["path"]).name for f in comparison["strategies"][name]["files"]] == [
            f"out-{name}-{index:03d}.png" for index in range(9)
        ]


def test_compare_measures_the_largest_difference_over_all_frames():
    from npu_port.infer.compare import Comparison
    from npu_port.infer.run import GenerationResult

    video = np.full((5, 4, 4, 3), 0.5, dtype=np.float32)
    changed = video.copy()
    changed[4, 3, 3, 2] += 0.25  # the last frame only

    def result(data, name):
        return GenerationResult(data, name, name, "", 0.1, [0.1], 0.2, {"bytes": 0, "what": "-"})

    comparison = Comparison.measure({"a": result(video, "a"), "b": result(changed, "b")}, 0.1)
    assert comparison.max_abs_diff["b"] == 0.25 and comparison.diverged == ["b"]


def test_an_mp4_is_written_when_imageio_ffmpeg_is_there(model_cache, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    import imageio

    output = tmp_path / "clip.mp4"
    assert infer(tmp_path, "--model", "tiny-wan", "--steps", "2", "--strategy", "sdpa", "--output", str(output)) == 0
    data = report(tmp_path, "clip.json")
    digest = hashlib.sha256(output.read_bytes()).hexdigest()
    assert data["image"] == str(output) and data["files"] == [{"path": str(output), "sha256": digest}]
    frames = imageio.mimread(output)
    assert len(frames) == 5 and frames[0].shape == (64, 64, 3)


def test_an_mp4_without_its_writer_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio", None)  # as if it were not installed
    output = str(tmp_path / "clip.mp4")
    assert infer(tmp_path, "--model", "tiny-wan", "--output", output) == 2
    assert capsys.readouterr().err == (
        f"npu-port: --output {output!r}: writing mp4 needs imageio and imageio-ffmpeg (imageio is not installed): "
        f"{extra_hint('video')}; or give an image extension to write the frames as images "
        f"({tmp_path / 'clip'}-000.png, ...)\n"
    )
    assert '[video]" (or: pip install imageio imageio-ffmpeg)' in extra_hint("video")  # as npu-port was installed
    assert_nothing_loaded()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--model", "tiny-wan", "--frames", "6"], "frames must be 4k+1 (1, 5, ...) between 1 and 33 for this model, got 6"),
        (["--model", "tiny-wan", "--frames", "37"], "frames must be 4k+1 (1, 5, ...) between 1 and 33 for this model, got 37"),
        (["--model", "tiny-wan", "--frames", "0"], "frames must be 4k+1 (1, 5, ...) between 1 and 33 for this model, got 0"),
        (["--model", "tiny-flux", "--frames", "5"], "--frames is for text-to-video models; this model is text-to-image (one image)"),
        (["--frames", "5"], "--frames is for text-to-video models; this model is text-to-image (one image)"),
        (["--model", "tiny-dit", "--frames", "1"], "--frames is for text-to-video models; this model is class-conditional (one image)"),
        (["--model", "tiny-wan", "--height", "72"], "height must be a multiple of 16 between 16 and 128 for this model, got 72"),
        (["--model", "tiny-flux", "--width", "1024"], "width must be a multiple of 16 between 16 and 512 for this model, got 1024"),
        (["--model", "tiny-flux", "--output", "x.mp4"], "--output 'x.mp4': '.mp4' is not an image format npu-port can write"),
        (
            ["--model", "tiny-flux", "--text-encoder-device", "cpu"],
            "--text-encoder-device: 'tiny-flux' is a text-to-image pipeline whose prompts npu-port cannot encode apart",
        ),
        (
            ["--model", "tiny-wan", "--text-encoder-device", "cpu"],
            "--text-encoder-device: 'tiny-wan' is a text-to-video pipeline whose prompts npu-port cannot encode apart",
        ),
    ],
)  # fmt: skip
def test_bad_video_input_is_one_line_before_loading(tmp_path, capsys, arguments, message):
    assert infer(tmp_path, *arguments) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npu-port: {message}") and err.count("\n") == 1, err
    assert_nothing_loaded()


@given(frames=st.integers(-10, 100))
def test_frames_are_4k_plus_1_within_the_models_bound(frames):
    from npu_port.errors import InferenceError

    request = GenerationRequest(frames=frames)
    valid = 1 <= frames <= 33 and frames % 4 == 1
    try:
        BUILTIN_LIMITS["tiny-wan"].check(request)
    except InferenceError as exc:
        assert not valid and str(exc).startswith("frames must be 4k+1")
    else:
        assert valid


def test_a_saved_copy_is_known_as_video_from_its_configs(model_cache, tmp_path, capsys):
    """A directory holding the tiny Wan pipeline gets its kind, factor and frame rule from its configs alone."""
    from npu_port.infer.limits import directory_limits

    limits = directory_limits(str(tiny_model_dir("tiny-wan")))
    assert (limits.kind, limits.factor, limits.frame_factor, limits.encoder_apart) == (TEXT_TO_VIDEO, 16, 4, False)
    flux = directory_limits(str(tiny_model_dir("tiny-flux")))
    assert (flux.kind, flux.factor, flux.encoder_apart) == (TEXT_TO_IMAGE, 16, False)
    assert directory_limits(str(tiny_model_dir("tiny"))).encoder_apart is True


def test_the_demo_refuses_a_video_model_in_one_line(tmp_path, capsys):
    pytest.importorskip("gradio")
    from npu_port.demo.__main__ import main as demo_main

    assert demo_main(["--model", "tiny-wan", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "gradio_demo_npu: 'tiny-wan' is a text-to-video model and the demo shows images; run it with npu-port infer "
        "--model tiny-wan\n"
    )
    assert_nothing_loaded()


def test_the_demo_offers_tiny_flux_at_its_own_default_size(model_cache):
    from npu_port.demo.form import default_size

    assert default_size(_load("tiny-flux")) == 128  # not the 512 px fallback of a transformer without sample_size
