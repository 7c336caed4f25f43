"""Each piece the transformers adapter resolves, taken away as a release that moved it would: the tiny pipeline still
makes the same image (its text encoder on transformers' own path), with one warning naming transformers, its version
and the piece, and ``explain()`` saying what was not routed. Nothing raises in a forward."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import npu_port
from npu_port import support
from npu_port.upstream import transformers as upstream

from .removal import one_decline, remove

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

FEATURES = (upstream.TEXT_ENCODERS, upstream.LOGGING)
TEXT_PIECES = [p.name for p in upstream.ADAPTER.pieces() if p.feature == upstream.TEXT_ENCODERS]
LOGGING_PIECES = [p.name for p in upstream.ADAPTER.pieces() if p.feature == upstream.LOGGING]
#: The oldest transformers whose CLIP computes through the AttentionInterface (npu_port/support.py): an older one
#: lacks the pieces already, so there is nothing to take away (the decline itself is tested there by
#: tests/integrations/test_text_encoder_pipeline.py), and conftest deselects these tests.
needs_pieces = pytest.mark.transformers_min(
    support.BY_PACKAGE["transformers"].features["text encoders routed (transformers AttentionInterface)"]
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny text-to-image pipeline (CLIP text encoder + UNet), loaded once, and its image under ``sdpa`` with
    every piece in place."""
    import os

    from npu_port.infer.models import load_pipeline
    from npu_port.infer.run import GenerationRequest, generate

    saved = os.environ.get("NPU_PORT_CACHE_DIR")
    os.environ["NPU_PORT_CACHE_DIR"] = str(tmp_path_factory.mktemp("npu-port-models"))
    try:
        loaded = load_pipeline("tiny", torch.device("cpu"), torch.float32, progress_bar=False)
    finally:
        if saved is None:
            os.environ.pop("NPU_PORT_CACHE_DIR", None)
        else:
            os.environ["NPU_PORT_CACHE_DIR"] = saved
    request = GenerationRequest(strategy="sdpa", steps=2, seed=0)
    intact = generate(loaded, request)
    assert "text_encoder: CLIPTextModel, attention implementation sdpa (routed)" in intact.strategy_explanation
    return loaded, request, _pixels(intact.image)


def _pixels(image):
    return (np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8)


@needs_pieces
@pytest.mark.parametrize("name", TEXT_PIECES)
def test_without_the_piece_the_pipeline_makes_the_same_image_with_one_warning(tiny, monkeypatch, name):
    from npu_port.infer.run import generate

    loaded, request, expected = tiny
    remove(monkeypatch, upstream.ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = generate(loaded, request)
    message = one_decline(caught, upstream.ADAPTER, name)
    assert message.startswith(f"{upstream.TEXT_ENCODERS}: transformers {upstream.ADAPTER.version()} has no {name} (")
    assert f"not routed: {message}" in result.strategy_explanation
    assert np.array_equal(_pixels(result.image), expected)


@needs_pieces
@pytest.mark.parametrize("name", TEXT_PIECES)
def test_a_bare_model_without_the_piece_runs_transformers_own_attention(monkeypatch, name):
    from npu_port.integrations.diffusers.tiny_text2image import tiny_clip_text_encoder

    model = tiny_clip_text_encoder(100, 99, 98).eval()
    ids = torch.randint(0, 98, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
    remove(monkeypatch, upstream.ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with npu_port.attention_strategy("sdpa", target=model) as handle:
            with torch.no_grad():
                got = model(input_ids=ids).last_hidden_state
            report = handle.report()
    assert not handle.calls and torch.equal(got, expected)
    message = one_decline(caught, upstream.ADAPTER, name)
    assert [d["message"] for d in report["declines"]] == [message]
    assert report["text_models"][0]["routed"] is False


@pytest.mark.parametrize("name", LOGGING_PIECES)
def test_without_logging_npu_ports_quiet_console_declines(monkeypatch, name):
    from npu_port.infer.multi import _no_loading_bars

    remove(monkeypatch, upstream.ADAPTER, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _no_loading_bars()
    one_decline(caught, upstream.ADAPTER, name)
