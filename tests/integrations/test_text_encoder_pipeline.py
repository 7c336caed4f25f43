"""A Stable Diffusion pipeline with its CLIP text encoder under a strategy, under every diffusers and transformers of
the CI lanes: from what ported projects pin (diffusers 0.11.1 with transformers 4.25.1, 0.14.0 with 4.30.2) to the
newest release.

The pipeline is built from configs (npu-port's tiny text-to-image model, saved and loaded with ``from_pretrained``,
as a project loads its own) with the installed versions. A strategy applied to it must run and match the pipeline
as it was, and ``restore()`` must give back the very same outputs. Its text encoder is routed where transformers
computes CLIP's attention through ``AttentionInterface`` (from the version ``npu_port.support`` claims); under an older
transformers the integration declines for it: the encoder runs on its own path, untouched, and ``explain()`` names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import npu_port
from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image
from npu_port.support import supported
from npu_port.upstream import UpstreamDeclinedWarning, forget_declines
from tests.versions import at_least

#: Where the modern path for CLIP text encoders is claimed from (the same number the lanes test).
CLIP_ROUTED_FROM = supported("transformers").features["text encoders routed (transformers AttentionInterface)"]
#: Where transformers has the attention interface at all (measured; below it, the integration declines with one
#: warning).
INTERFACE_FROM = "4.51.0"
#: A project of the diffusers 0.14 era (our fixture): xformers switched on, everything on "cuda".
PROJECT = Path(__file__).parents[1] / "fixtures" / "old_text2image_project" / "generate.py"


@pytest.fixture(autouse=True)
def _fresh_declines():
    forget_declines()
    yield
    forget_declines()


def _declined(caught):
    return [str(w.message) for w in caught if issubclass(w.category, UpstreamDeclinedWarning)]


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-text2image")
    build_tiny_text2image(str(directory))
    return directory


def _load(directory):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(directory))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _generate(pipe):
    generator = torch.Generator().manual_seed(0)
    return pipe("a red fox", num_inference_steps=2, generator=generator, output_type="np", height=32, width=32).images


def _implementation(model):
    return getattr(model.config, "_attn_implementation", None)  # absent before transformers 4.36


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["vanilla", "sdpa"])
def test_a_strategy_on_a_text_to_image_pipeline_runs_it_and_restores_it_exactly(pipeline_dir, strategy):
    pipe = _load(pipeline_dir)
    before = _generate(pipe)
    implementation = _implementation(pipe.text_encoder)
    layers = pipe.text_encoder.config.num_hidden_layers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.attention_strategy(strategy, target=pipe) as handle:
            routed = _generate(pipe)
            by_module = dict(handle.applied.calls_by_module)
            explained = handle.explain()
            report = handle.report()
    after = _generate(pipe)

    assert np.array_equal(after, before)  # restore() puts the very same pipeline back
    assert np.abs(routed - before).max() <= 1e-4
    unet_calls = {name: n for name, n in by_module.items() if name.startswith("unet.")}
    assert unet_calls and all(n == 2 for n in unet_calls.values()), by_module  # each attention, once per step
    assert "text_encoder" in explained and "CLIPTextModel" in explained
    (text_model,) = report["text_models"]
    if at_least("transformers", CLIP_ROUTED_FROM):
        # the prompt and the empty negative prompt (classifier-free guidance): once through each layer
        assert by_module.get("text_encoder") == 2 * layers, by_module
        assert text_model["routed"] is True and _declined(caught) == [] and report["declines"] == []
    else:
        assert "text_encoder" not in by_module, by_module
        assert (
            text_model["routed"] is False
            and text_model["reason"]
            and f"(not routed: {text_model['reason']})" in explained
        )
    if not at_least("transformers", INTERFACE_FROM):  # no interface at all: one warning, and the report says it
        version = npu_port.upstream.transformers.ADAPTER.version()
        (message,) = _declined(caught)
        assert message.startswith(
            f"text encoders routed (transformers AttentionInterface): transformers {version} has no AttentionInterface"
        )
        assert [d["message"] for d in report["declines"]] == [message] and f"not routed: {message}" in explained
    assert _implementation(pipe.text_encoder) == implementation


@pytest.mark.e2e
@pytest.mark.slow
def test_a_project_of_that_era_runs_enable_xformers_under_npu_port_run(pipeline_dir, tmp_path):
    """The project calls ``enable_xformers_memory_efficient_attention()`` and runs on "cuda": under
    ``npu-port run --device cpu`` it runs unchanged, its text encoder routed or declined (one warning, the report's
    ``declines``), and its image is the reference's (diffusers' and transformers' own attention, on the CPU)."""
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    reference, routed, report = tmp_path / "reference.pt", tmp_path / "routed.pt", tmp_path / "report.json"
    common = [str(PROJECT), "--models", str(pipeline_dir)]
    subprocess.run(
        [sys.executable, *common, "--out", str(reference), "--device", "cpu", "--no-xformers"],
        check=True,
        env=env,
        capture_output=True,
    )
    ran = subprocess.run(
        [sys.executable, "-m", "npu_port", "run", "--device", "cpu", "--report", str(report), *common, "--out",
         str(routed)],
        env=env,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    data = json.loads(report.read_text())
    (hooked,) = data["enable_xformers_routed"]
    assert hooked["object"] == "StableDiffusionPipeline"
    if at_least("diffusers", "0.12.0"):  # processors: the switch puts npu-port's in, and they count their calls
        assert sum(hooked["calls"].values()) > 0
    else:  # 0.11 has no processors: its legacy classes are routed by the process-wide strategy, which counts them
        assert "(process-wide strategy" in hooked["routed"] and hooked["calls"] == {}
        assert sum(data["attention_calls"].values()) > 0
    if at_least("transformers", INTERFACE_FROM) or not at_least("diffusers", "0.12.0"):
        # (0.11: nothing is applied to the pipeline, so its text encoder is not even tried: nothing to decline)
        assert data["declines"] == [] and "UpstreamDeclinedWarning" not in ran.stderr
    else:
        (decline,) = data["declines"]
        assert decline["library"] == "transformers" and decline["missing"] == ["AttentionInterface"]
        assert ran.stderr.count("UpstreamDeclinedWarning") == 1 and "Traceback" not in ran.stderr
    got, expected = torch.load(routed)["image"], torch.load(reference)["image"]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
