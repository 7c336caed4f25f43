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

import numpy as np
import pytest
import torch

import npu_port
from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image
from npu_port.support import supported
from tests.versions import at_least

#: Where the modern path for CLIP text encoders is claimed from (the same number the lanes test).
CLIP_ROUTED_FROM = supported("transformers").features["CLIP text encoders routed (AttentionInterface)"]


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
    with npu_port.attention_strategy(strategy, target=pipe) as handle:
        routed = _generate(pipe)
        by_module = dict(handle.applied.calls_by_module)
        explained = handle.explain()
    after = _generate(pipe)

    assert np.array_equal(after, before)  # restore() puts the very same pipeline back
    assert np.abs(routed - before).max() <= 1e-4
    unet_calls = {name: n for name, n in by_module.items() if name.startswith("unet.")}
    assert unet_calls and all(n == 2 for n in unet_calls.values()), by_module  # each attention, once per step
    assert "text_encoder" in explained and "CLIPTextModel" in explained
    if at_least("transformers", CLIP_ROUTED_FROM):
        # the prompt and the empty negative prompt (classifier-free guidance): once through each layer
        assert by_module.get("text_encoder") == 2 * layers, by_module
    else:
        assert "text_encoder" not in by_module, by_module
    assert _implementation(pipe.text_encoder) == implementation
