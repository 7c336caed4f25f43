"""A pipeline with a CLIP text encoder, under every transformers of the support range: routed exactly where the
installed transformers has the attention interface, declined with the reason where it has not (4.25-4.49: the
diffusers 0.11-0.14 era) — never an error in ``enable_xformers_memory_efficient_attention()`` or the forward.

Runs in the main suite (newest releases) and in the CI lanes of the oldest versions (``.ci/run``). The project is our
own fixture (``tests/fixtures/old_text2image_project``), the pipeline our tiny one built from configs; "reference"
is the same pipeline with diffusers' and transformers' own attention.
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
from npu_port.upstream import UpstreamDeclinedWarning, forget_declines
from npu_port.upstream import transformers as upstream

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

PROJECT = Path(__file__).parents[1] / "fixtures" / "old_text2image_project" / "generate.py"
HAS_INTERFACE = upstream.ADAPTER.has("AttentionInterface")
DECLINE = (
    f"{upstream.TEXT_ENCODERS}: transformers {upstream.ADAPTER.version()} has no AttentionInterface "
    "(AttentionInterface: looked in transformers:AttentionInterface, transformers.modeling_utils:AttentionInterface); "
    "left to transformers"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image

    folder = tmp_path_factory.mktemp("tiny-text2image")
    build_tiny_text2image(str(folder))
    return folder


@pytest.fixture(autouse=True)
def _fresh_declines():
    forget_declines()
    yield
    forget_declines()


def _generate(pipe):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return pipe("a lighthouse", num_inference_steps=2, generator=generator, output_type="np").images


def test_a_strategy_on_the_pipeline_routes_its_text_encoder_or_says_why_not(models):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(models), safety_checker=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    expected = _generate(pipe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.attention_strategy("sdpa", target=pipe) as handle:
            got = _generate(pipe)
            report = handle.report()
            explanation = handle.explain()
    declined = [str(w.message) for w in caught if issubclass(w.category, UpstreamDeclinedWarning)]
    (text_model,) = report["text_models"]
    if HAS_INTERFACE:
        assert declined == [] and report["declines"] == [] and text_model["routed"] is True
        assert handle.applied.calls_by_module["text_encoder"] == 2 * pipe.text_encoder.config.num_hidden_layers
    else:
        assert declined == [DECLINE] and [d["message"] for d in report["declines"]] == [DECLINE]
        assert text_model["routed"] is False and text_model["reason"].startswith(
            f"transformers {upstream.ADAPTER.version()} has no AttentionInterface"
        )
        assert f"not routed: {DECLINE}" in explanation and "text_encoder" not in handle.applied.calls_by_module
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_project_of_that_era_runs_enable_xformers_under_npu_port_run(models, tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    reference, routed, report = tmp_path / "reference.pt", tmp_path / "routed.pt", tmp_path / "report.json"
    common = [str(PROJECT), "--models", str(models)]
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
    assert hooked["object"] == "StableDiffusionPipeline" and sum(hooked["calls"].values()) > 0
    if HAS_INTERFACE:
        assert data["declines"] == [] and "UpstreamDeclinedWarning" not in ran.stderr
    else:
        assert [d["message"] for d in data["declines"]] == [DECLINE]
        assert ran.stderr.count("UpstreamDeclinedWarning") == 1 and "Traceback" not in ran.stderr
    got, expected = torch.load(routed)["image"], torch.load(reference)["image"]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
